"""The lean door answers exactly as the whole app (issue 33 item 2): the same requests, good and
bad, sent to a broker with ``lean_door=protocol`` and one with ``lean_door=off`` (and a pair with
ACL on), answers compared byte for byte — status line, headers, body — apart from the date
header, generated ids and timestamps. Raw HTTP/1.1 over keep-alive connections, so pipelining,
chunked bodies, ``Expect: 100-continue``, HTTP/1.0 and ``Connection: close`` are compared too.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from tidemq.protocol.signing import sign_rest

from tests.support.acl import USERS, write_acl
from tests.support.broker import BrokerHandle, run_broker
from tests.support.procs import RedisServer, ServiceProcess, free_port
from tests.support.wait import wait_until
from tidemq_server.broker.app import create_broker_app
from tidemq_server.broker.settings import BrokerSettings
from tidemq_server.common.door_http import LeanDoor

pytestmark = pytest.mark.integration

T, TX = "Lean", "LeanTx"  # topics both brokers create alike
J = "application/json"
MP = "application/msgpack"


def req(method: str, target: str, body: bytes = b"", ctype: str | None = J,
        headers: tuple[str, ...] = (), version: str = "1.1", length: bool = True) -> bytes:
    head = [f"{method} {target} HTTP/{version}", "host: 127.0.0.1", *headers]
    if ctype is not None and (body or method == "POST"):
        head.append(f"content-type: {ctype}")
    if length and (body or method in ("POST", "PUT")):
        head.append(f"content-length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def js(obj: object) -> bytes:
    return json.dumps(obj).encode()


def mp(obj: object) -> bytes:
    return bytes(msgpack.packb(obj, use_bin_type=True))


def chunked(body: bytes, size: int = 7) -> bytes:
    parts = [b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size])
             for i in range(0, len(body), size)]
    return b"".join(parts) + b"0\r\n\r\n"


class Conn:
    """One raw keep-alive connection; ``answers(n)`` reads n whole answers as bytes."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=15)
        self.buf = b""

    def close(self) -> None:
        self.sock.close()

    def _more(self) -> bool:
        data = self.sock.recv(65536)
        self.buf += data
        return bool(data)

    def answer(self) -> bytes:
        while b"\r\n\r\n" not in self.buf:
            if not self._more():
                raise AssertionError(f"connection closed mid-answer: {self.buf!r}")
        head, _, _ = self.buf.partition(b"\r\n\r\n")
        at = len(head) + 4
        lines = head.lower().split(b"\r\n")
        length = next((int(x.split(b":", 1)[1]) for x in lines
                       if x.startswith(b"content-length:")), None)
        if length is None:  # no length: the body runs until the server closes
            while self._more():
                pass
            length = len(self.buf) - at
        while len(self.buf) < at + length:
            if not self._more():
                raise AssertionError("connection closed mid-body")
        raw, self.buf = self.buf[:at + length], self.buf[at + length:]
        return raw

    def closed(self) -> bool:
        """Whether the server closed the connection (after everything it sent was read)."""
        self.sock.settimeout(2)
        try:
            return not self._more()
        finally:
            self.sock.settimeout(15)


def normal(raw: bytes) -> bytes:
    raw = re.sub(rb"(?im)^date: [^\r]*", b"date: *", raw)
    raw = re.sub(rb"[0-9a-f]{32}", b"<id>", raw)
    raw = re.sub(rb"(?<![0-9])1[0-9]{12}(?![0-9])", b"<ms>", raw)
    raw = re.sub(rb"\xcf\x00\x00\x01.{5}", b"<ms>", raw, flags=re.DOTALL)  # msgpack uint64
    return re.sub(rb"recv=[0-9]+,stored=[0-9]+", b"recv=*,stored=*", raw)


def exchange(pair: tuple[BrokerHandle, BrokerHandle], requests: list[bytes],
             pipelined: bool = False) -> list[tuple[bytes, bytes]]:
    """Each request to both brokers over one connection each; their answers side by side."""
    answers: list[list[bytes]] = []
    for broker in pair:
        conn = Conn(broker.proc.port)
        try:
            if pipelined:
                conn.sock.sendall(b"".join(requests))
                answers.append([conn.answer() for _ in requests])
            else:
                got = []
                for request in requests:
                    conn.sock.sendall(request)
                    try:
                        got.append(conn.answer())
                    except TimeoutError:
                        raise AssertionError(f"no answer to {request[:200]!r}") from None
                answers.append(got)
        finally:
            conn.close()
    return list(zip(answers[0], answers[1], strict=True))


def assert_same(pairs: list[tuple[bytes, bytes]], requests: list[bytes]) -> None:
    differ = [f"request {r[:120]!r}:\n lean {normal(a)[:600]!r}\n full {normal(b)[:600]!r}"
              for r, (a, b) in zip(requests, pairs, strict=True) if normal(a) != normal(b)]
    assert not differ, "\n".join(differ)


def _setup(broker: BrokerHandle) -> None:
    broker.create_topic(T, queues=4)
    broker.create_topic(TX, queues=2)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory,
         redis_server: RedisServer) -> Iterator[tuple[BrokerHandle, BrokerHandle]]:
    work = tmp_path_factory.mktemp("lean")
    with run_broker(work, redis_server.url, lean_door="protocol", grpc_enabled=False) as lean, \
            run_broker(work, redis_server.url, lean_door="off", grpc_enabled=False) as full:
        _setup(lean)
        _setup(full)
        yield lean, full


MESSAGES = f"/v1/topics/{T}/messages"
PULL = f"/v1/topics/{T}/queues/0/messages"
GOOD = js({"messages": [{"message_id": "m-1", "body": "hello", "tag": "a", "keys": ["k"]}]})

#: Requests of the hot routes, good and bad, each answered by the lean door or by the app.
HOT_REQUESTS = [
    req("POST", MESSAGES, GOOD),
    req("POST", MESSAGES, GOOD),  # a repeated id: the first result
    req("POST", MESSAGES, js({"messages": [{"body": f"b{i}"} for i in range(5)]})),
    req("POST", MESSAGES, mp({"messages": [{"message_id": "m-2", "body": b"\xff\x00"}]}), MP,
        ("accept: application/msgpack",)),
    req("POST", MESSAGES, js({"messages": [{"message_id": "m-3", "body": "t"}]}), J,
        ("x-tidemq-timing: 1",)),
    req("POST", MESSAGES, js({"messages": [{"message_id": "m-4", "body": "t"}]}), J,
        ("accept: application/msgpack",)),
    req("POST", MESSAGES, GOOD, "text/plain"),
    req("POST", MESSAGES, GOOD, None),
    req("POST", MESSAGES, GOOD, "application/json; charset=latin-1"),
    req("POST", MESSAGES, b"{not json"),
    req("POST", MESSAGES, b""),
    req("POST", MESSAGES, js({})),
    req("POST", MESSAGES, js({"messages": "no"})),
    req("POST", MESSAGES, js({"messages": [{"body": "x", "colour": "red"}]})),
    req("POST", MESSAGES, js({"messages": [{"body": "x", "delay_level": 99}]})),
    req("POST", MESSAGES, js({"messages": [{"body": "x", "body_encoding": "base64"}]})),
    req("POST", MESSAGES, js({"messages": [{"body": "x", "message_id": "y" * 65}]})),
    req("POST", MESSAGES + "?x=1", GOOD),
    req("POST", "/v1/topics/Nope/messages", GOOD),
    req("POST", "/v1/topics/bad$name/messages", GOOD),
    req("POST", "/v1/topics/RMQ_SYS_TRANS_HALF_TOPIC/messages", GOOD),
    req("POST", "/v1/topics/%52MQ_SYS/messages", GOOD),
    req("GET", MESSAGES),
    req("PUT", MESSAGES, GOOD),
    # pulls
    req("GET", PULL + "?offset=0&max=3"),
    req("GET", PULL),
    req("GET", PULL + "?offset=0&max=2&tags=a"),
    req("GET", PULL + "?offset=0&max=1&group=g1"),
    req("GET", PULL + "?offset=0&max=1&group=bad$group"),
    req("GET", PULL + "?offset=abc"),
    req("GET", PULL + "?offset=+1"),
    req("GET", PULL + "?max=0"),
    req("GET", PULL + "?max=5000"),
    req("GET", PULL + "?wait_ms=-1"),
    req("GET", PULL + "?offset=999999"),
    req("GET", PULL + "?offest=0"),
    req("GET", PULL + "?form=bogus"),
    req("GET", PULL + "?offset=0", b"", None, ("accept: application/msgpack",)),
    req("GET", f"/v1/topics/{T}/queues/x/messages"),
    req("GET", f"/v1/topics/{T}/queues/99/messages"),
    req("GET", "/v1/topics/Nope/queues/0/messages"),
    req("POST", "/v1/pull", js({"queues": [{"topic": T, "queue_id": 0, "offset": 0}], "max": 2})),
    req("POST", "/v1/pull", js({"queues": []})),
    req("POST", "/v1/pull", js({"queues": [{"topic": "Nope", "queue_id": 0}]})),
    req("POST", "/v1/pull", b"[1, 2"),
    # groups
    req("POST", "/v1/groups/g1/heartbeat", js({"client_id": "c1", "subscriptions": {T: "*"}})),
    req("POST", "/v1/groups/g1/heartbeat", js({"subscriptions": {}})),
    req("POST", "/v1/groups/g1/heartbeat", js({"client_id": "c1", "extra": 1})),
    req("POST", "/v1/groups/bad$g/heartbeat", js({"client_id": "c1"})),
    req("POST", "/v1/groups/g1/ack", js({"receipt_handles": ["nonsense"]})),
    req("POST", "/v1/groups/g1/ack", js({"receipt_handles": []})),
    req("POST", "/v1/groups/g1/ack", js({"handles": []})),
    req("POST", "/v1/producers/pg1/heartbeat", js({"client_id": "p1"})),
    req("POST", "/v1/producers/pg1/heartbeat", js({"client_id": ""})),
    req("POST", "/v1/producers/bad$g/heartbeat", js({"client_id": "p1"})),
    # transactions
    req("POST", "/v1/transactions", js({"producer_group": "pg1", "topic": TX,
                                        "message": {"message_id": "tx-1", "body": "half"}})),
    req("POST", "/v1/transactions", js({"producer_group": "pg1", "topic": TX,
                                        "messages": [{"message_id": "tx-2", "body": "h"}]})),
    req("POST", "/v1/transactions", js({"producer_group": "pg1", "topic": "Nope",
                                        "message": {"body": "half"}})),
    req("POST", "/v1/transactions", js({"producer_group": "pg1", "topic": TX})),
    req("POST", "/v1/transactions", js({"topic": TX, "message": {"body": "x"}, "what": 1})),
    req("POST", "/v1/transactions?producer_group=pg1", js({"producer_group": "pg1"})),
    req("POST", "/v1/transactions/0123456789abcdef0123456789abcdef/end",
        js({"producer_group": "pg1", "action": "commit"})),
    req("POST", "/v1/transactions/x/end", js({"producer_group": "pg1", "action": "maybe"})),
    req("POST", "/v1/transactions/x/end", js({"action": "commit"})),
    req("POST", "/v1/transactions/end", js({"producer_group": "pg1", "ends": [
        {"transaction_id": "nope", "action": "rollback"}]})),
    req("POST", "/v1/transactions/end", js({"producer_group": "pg1", "ends": "x"})),
    req("POST", "/v1/transactions/end", js([1])),
]


def test_hot_requests_answer_alike(pair: tuple[BrokerHandle, BrokerHandle]) -> None:
    assert_same(exchange(pair, HOT_REQUESTS), HOT_REQUESTS)


def test_oversize_answers_alike(pair: tuple[BrokerHandle, BrokerHandle]) -> None:
    """A declared length past the limit is refused before the body is read (the connection
    then still waits for that body: one request of its own)."""
    oversize = [req("POST", MESSAGES, b"", J, ("content-length: 999999999",), length=False)]
    assert_same(exchange(pair, oversize), oversize)


def test_transaction_ends_answer_alike(pair: tuple[BrokerHandle, BrokerHandle]) -> None:
    begin = req("POST", "/v1/transactions", js({"producer_group": "pg2", "topic": TX,
                                                "message": {"body": "half"}}))
    ids = []
    for broker in pair:
        conn = Conn(broker.proc.port)
        conn.sock.sendall(begin)
        raw = conn.answer()
        conn.close()
        ids.append(json.loads(raw.partition(b"\r\n\r\n")[2])["transaction_id"])
    for body in ({"producer_group": "pg2", "action": "commit"},
                 {"producer_group": "pg2", "action": "commit"},
                 {"producer_group": "pg2", "action": "rollback"}):
        answers = []
        for broker, tx in zip(pair, ids, strict=True):
            conn = Conn(broker.proc.port)
            conn.sock.sendall(req("POST", f"/v1/transactions/{tx}/end", js(body)))
            answers.append(conn.answer())
            conn.close()
        assert normal(answers[0]) == normal(answers[1])
        assert b" 200 " in answers[0].split(b"\r\n")[0] or b"409" in answers[0][:12]


def test_framing_answers_alike(pair: tuple[BrokerHandle, BrokerHandle]) -> None:
    body = js({"messages": [{"message_id": "f-1", "body": "framed"}]})
    pipelined = [req("POST", MESSAGES, body), req("GET", PULL + "?offset=0&max=1"),
                 req("GET", "/healthz"), req("POST", MESSAGES, b"{bad")]
    assert_same(exchange(pair, pipelined, pipelined=True), pipelined)
    framed = [
        req("POST", MESSAGES, chunked(body), J, ("transfer-encoding: chunked",), length=False),
        req("POST", MESSAGES, body, J, ("expect: 100-continue",)),
    ]
    assert_same(exchange(pair, framed), framed)
    for last in (req("POST", MESSAGES, body, J, version="1.0"),
                 req("POST", MESSAGES, body, J, ("connection: close",))):
        answers = []
        for broker in pair:
            conn = Conn(broker.proc.port)
            conn.sock.sendall(last)
            answers.append(conn.answer())
            assert conn.closed()
            conn.close()
        assert normal(answers[0]) == normal(answers[1])


def test_the_lean_door_takes_the_hot_requests() -> None:
    """The requests above that the lean door serves itself (the rest go to the app)."""
    door = LeanDoor(create_broker_app(BrokerSettings(grpc_enabled=False)))
    taken = set()
    for raw in HOT_REQUESTS:
        line = raw.split(b"\r\n", 1)[0].split(b" ")
        headers = [tuple(h.split(b": ", 1)) for h in raw.split(b"\r\n\r\n")[0].split(b"\r\n")[1:]]
        if door.take({}, line[0], line[1], headers):  # type: ignore[arg-type]
            taken.add(line[0] + b" " + line[1])
    assert {b"POST " + MESSAGES.encode(), b"GET " + PULL.encode() + b"?offset=0&max=3",
            b"POST /v1/pull", b"POST /v1/groups/g1/heartbeat", b"POST /v1/groups/g1/ack",
            b"POST /v1/producers/pg1/heartbeat", b"POST /v1/transactions",
            b"POST /v1/transactions/end", b"POST /v1/transactions/x/end"} <= taken
    for app_only in (b"POST " + MESSAGES.encode() + b"?x=1", b"GET " + PULL.encode() +
                     b"?offset=abc", b"GET " + PULL.encode() + b"?offest=0",
                     b"POST /v1/topics/%52MQ_SYS/messages", b"GET " + MESSAGES.encode()):
        assert app_only not in taken


# --- ACL on ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def acl_pair(tmp_path_factory: pytest.TempPathFactory,
             redis_server: RedisServer) -> Iterator[tuple[BrokerHandle, BrokerHandle]]:
    work = tmp_path_factory.mktemp("lean-acl")
    acl = work / "acl.yaml"
    write_acl(acl)
    with run_broker(work, redis_server.url, lean_door="protocol", grpc_enabled=False,
                    acl_file=acl) as lean, \
            run_broker(work, redis_server.url, lean_door="off", grpc_enabled=False,
                       acl_file=acl) as full:
        for broker in (lean, full):
            for topic in ("orders-1", "orders-secret"):
                path = f"/v1/topics/{topic}"
                body = js({"queues": 2})
                conn = Conn(broker.proc.port)
                conn.sock.sendall(signed("admin", "PUT", path, body))
                assert b" 200 " in conn.answer()[:16]
                conn.close()
        yield lean, full


def signed(user: str | None, method: str, target: str, body: bytes = b"",
           ctype: str | None = J) -> bytes:
    if user is None:
        return req(method, target, body, ctype)
    ak, sk, _ = USERS[user]
    path, _, query = target.partition("?")
    headers = sign_rest(ak, sk, method, path, query, body, when_s=time.time())
    return req(method, target, body, ctype, tuple(f"{k}: {v}" for k, v in headers.items()))


def test_acl_answers_alike(acl_pair: tuple[BrokerHandle, BrokerHandle], tmp_path: Path) -> None:
    send = "/v1/topics/orders-1/messages"
    body = js({"messages": [{"message_id": "a-1", "body": "x"}]})
    half = js({"producer_group": "pg-orders", "topic": "orders-1", "message": {"body": "h"}})
    requests = [
        signed("producer", "POST", send, body),
        signed(None, "POST", send, body),
        signed("consumer", "POST", send, body),
        signed("nobody", "POST", send, body),
        signed("producer", "POST", "/v1/topics/orders-secret/messages", body),
        signed("consumer", "GET", "/v1/topics/orders-1/queues/0/messages?offset=0"),
        signed("consumer", "GET", "/v1/topics/orders-secret/queues/0/messages?offset=0"),
        signed("producer", "GET", "/v1/topics/orders-1/queues/0/messages?offset=0"),
        signed("consumer", "POST", "/v1/groups/billing/heartbeat",
               js({"client_id": "c1", "subscriptions": {"orders-1": "*"}})),
        signed("consumer", "POST", "/v1/groups/other/ack", js({"receipt_handles": []})),
        signed("producer", "POST", "/v1/transactions", half),
        signed("consumer", "POST", "/v1/transactions", half),
        signed("producer", "POST", "/v1/producers/pg-orders/heartbeat", js({"client_id": "p"})),
        signed("producer", "POST", send, b"{bad json"),
    ]
    assert_same(exchange(acl_pair, requests), requests)


def _json_lines(path: Path) -> list[dict[str, Any]]:
    lines = []
    for text in path.read_text().splitlines():
        if text.startswith("{"):
            lines.append(json.loads(text))
    return lines


def test_json_log_lines_of_a_lean_request_carry_its_request_id(
        tmp_path: Path, redis_server: RedisServer) -> None:
    """The lean stack keeps the app's request-id middleware (JSON logs): a consumer
    heartbeat, served by the lean door, logs the member joining under the request's id."""
    port = free_port()
    env = {"TIDEMQ_BROKER_PORT": str(port), "TIDEMQ_BROKER_DATA_DIR": str(tmp_path / "json"),
           "TIDEMQ_BROKER_REDIS_URL": redis_server.url, "TIDEMQ_BROKER_CLUSTER": "lean-json",
           "TIDEMQ_BROKER_GRPC_ENABLED": "false", "TIDEMQ_BROKER_LOG_LEVEL": "info",
           "TIDEMQ_LOG_FORMAT": "json"}
    proc = ServiceProcess("broker", port, env, tmp_path).start()
    try:
        conn = Conn(port)
        conn.sock.sendall(req("POST", "/v1/groups/gj/heartbeat", js({"client_id": "cj"}), J,
                              ("x-request-id: req-lean-7",)))
        assert b" 200 " in conn.answer()[:16]
        conn.close()
        joined = wait_until(lambda: [line for line in _json_lines(proc.log_path)
                                     if "cj joined" in line.get("message", "")],
                            what="the heartbeat's log line")
    finally:
        proc.stop()
    assert joined[0]["request_id"] == "req-lean-7"
    assert LeanDoor(create_broker_app(BrokerSettings(grpc_enabled=False))).table.find(
        "POST", "/v1/groups/gj/heartbeat") is not None  # a hot route: the lean door served it
