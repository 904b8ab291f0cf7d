"""Small contract points a new user hit (real broker, scheduler and nameserver processes).

- cancelling a message that was never delayed is 404 MESSAGE_NOT_FOUND (docs/api.md), a
  delivered one 409 ALREADY_DELIVERED;
- the unknown-field error names every field a message takes;
- an over-long URL is 414 URI_TOO_LONG in the ``{code, message}`` shape, on every service;
  a request that is not HTTP is 400 BAD_REQUEST in that shape;
- a receipt handle whose invisibility ran out while nobody received the message again is
  current for both ack and change-invisibility (one rule, documented);
- docs/api.md does not call codes the services answer "never answered".
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from tidemq.protocol import ErrorCode
from tidemq.protocol.message import MESSAGE_FIELDS

from tests.scheduler.harness import DelayCluster, run_delay_cluster
from tests.support.broker import unique
from tests.support.procs import REPO, RedisServer, ServiceProcess, free_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory,
            redis_server: RedisServer) -> Iterator[DelayCluster]:
    with run_delay_cluster(tmp_path_factory.mktemp("contract"), redis_server.url) as c:
        yield c


def test_cancelling_a_message_never_delayed_is_message_not_found(cluster: DelayCluster) -> None:
    b = cluster.broker
    topic = b.create_topic(queues=1)
    plain, due = unique("plain"), unique("due")
    b.send(topic, {"message_id": plain, "body": "never delayed"},
           {"message_id": due, "body": "due soon", "delay_ms": 500})
    assert "never delayed" in b.error(cluster.cancel(plain), 404, "MESSAGE_NOT_FOUND")
    deadline = time.monotonic() + 15
    while cluster.state(due) != "stored" and time.monotonic() < deadline:
        time.sleep(0.1)
    b.error(cluster.cancel(due), 409, "ALREADY_DELIVERED")
    b.error(cluster.cancel(unique("nothing")), 404, "MESSAGE_NOT_FOUND")


def test_the_unknown_field_error_names_every_message_field(cluster: DelayCluster) -> None:
    b = cluster.broker
    topic = b.create_topic(queues=1)
    resp = b.http.post(f"/v1/topics/{topic}/messages",
                       json={"messages": [{"body": "x", "tga": "A"}]})
    message = b.error(resp, 400, "BAD_REQUEST")
    listed = set(re.findall(r"[a-z_]+", message.split("has only", 1)[1]))
    assert MESSAGE_FIELDS <= listed, MESSAGE_FIELDS - listed


def _raw(url: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


@pytest.fixture(scope="module")
def nameserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    port = free_port()
    ns = ServiceProcess("nameserver", port, {"TIDEMQ_NAMESRV_PORT": str(port)},
                        tmp_path_factory.mktemp("contract-ns")).start()
    yield ns
    ns.stop()


def test_an_over_long_url_is_414_in_the_error_shape(cluster: DelayCluster,
                                                    nameserver: ServiceProcess) -> None:
    for url in (cluster.broker.url, nameserver.url, cluster.scheduler.url):
        long_path = "/v1/messages/" + "x" * 20_000  # over the documented 16 KiB
        status, headers, body = _raw(url, f"GET {long_path} HTTP/1.1\r\nHost: t\r\n\r\n"
                                     .encode())
        assert status == 414, (url, status, body)
        assert headers["content-type"] == "application/json"
        assert httpx.Response(414, content=body).json()["code"] == "URI_TOO_LONG"
        status, headers, body = _raw(url, b"NOT HTTP AT ALL\r\n\r\n")
        assert status == 400 and headers["content-type"] == "application/json", body
        assert httpx.Response(400, content=body).json()["code"] == "BAD_REQUEST"
    ok = httpx.get(cluster.broker.url + "/v1/topics", params={"x": "y" * 100})
    assert ok.status_code == 400  # a normal URL still reaches the API (here: unknown param)


def test_an_expired_handle_is_current_for_ack_and_invisibility_alike(
        cluster: DelayCluster) -> None:
    b = cluster.broker
    topic = b.create_topic(queues=1)
    b.send(topic, {"body": "one"}, {"body": "two"})
    group = unique("workers")
    got = b.http.post(f"/v1/groups/{group}/receive", json={
        "topic": topic, "max": 2, "invisible_ms": 300, "wait_ms": 0}).json()["messages"]
    assert len(got) == 2
    time.sleep(0.6)  # both invisibilities ran out; nobody received them again
    resp = b.http.post(f"/v1/groups/{group}/ack",
                       json={"receipt_handles": [got[0]["receipt_handle"]]})
    assert resp.json() == {"acked": 1}
    resp = b.http.post(f"/v1/groups/{group}/invisibility", json={
        "receipt_handle": got[1]["receipt_handle"], "invisible_ms": 60_000})
    assert resp.status_code == 200, resp.text
    new = resp.json()["receipt_handle"]
    again = b.http.post(f"/v1/groups/{group}/receive", json={
        "topic": topic, "max": 2, "invisible_ms": 300, "wait_ms": 0}).json()["messages"]
    assert again == []  # one acked, one invisible for a minute again
    resp = b.http.post(f"/v1/groups/{group}/invisibility", json={
        "receipt_handle": got[1]["receipt_handle"], "invisible_ms": 1000})
    b.error(resp, 400, "INVALID_RECEIPT_HANDLE")  # superseded by the new handle
    assert b.http.post(f"/v1/groups/{group}/ack",
                       json={"receipt_handles": [new]}).json() == {"acked": 1}


def test_the_docs_do_not_call_answered_codes_never_answered() -> None:
    text = (REPO / "docs" / "api.md").read_text()
    for sentence in re.split(r"(?<=\.)\s", text):
        if "never answered" in sentence:
            named = set(re.findall(r"`([A-Z_]+)`", sentence))
            answered = {c.value for c in (ErrorCode.NOT_PRIMARY, ErrorCode.NOT_ENOUGH_REPLICAS)}
            assert not named & answered, sentence
    assert "`URI_TOO_LONG`" in text
