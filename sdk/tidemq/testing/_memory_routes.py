"""``MemoryTransport``: the SDK's ``HttpTransport`` answering the public REST API of
docs/api.md from the in-memory broker's state, for one nameserver address and one broker
address.

Requests are decoded as the real services decode them (JSON, msgpack, or the producer's record
batches through ``TransportRequest.payload``); answers are msgpack when the client accepts it,
else JSON (bodies as utf-8 or base64 text). A refused request gets the ``{code, message}``
answer and HTTP status of its ``ProtocolError``; an unknown path FastAPI's plain 404. Long
polls (pull, receive, checks) wait, in real time up to their ``wait_ms``, until a request or a
move of the clock changes something.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from tidemq._exceptions import WireConnectError
from tidemq._transport import Params, TransportRequest, TransportResponse
from tidemq.protocol import (
    CONTENT_JSON,
    CONTENT_MSGPACK,
    ErrorCode,
    OutgoingMessage,
    ProtocolError,
    parse_message,
    parse_messages,
    validate_client_id,
    validate_group_name,
)
from tidemq.protocol.codec import is_batch
from tidemq.protocol.records.v2_read import as_messages
from tidemq.protocol.topics import RETRY_PREFIX
from tidemq.testing._memory_simple import MemorySimple
from tidemq.testing._memory_store import MemoryStore
from tidemq.testing._memory_tx import MemoryTransactions

MAX_WAIT_MS = 30_000  # a long poll's wait is cut to this, as the broker does
BROKER_NAME = "memory-broker"
CLUSTER = "memory"


class Signal:
    """Wakes every long poll when the broker's state (or its clock) changed. (Plain futures,
    not ``asyncio.wait_for``, which may swallow a cancellation that meets a wake-up.)"""

    def __init__(self) -> None:
        self._waiters: set[asyncio.Future[None]] = set()

    def notify(self) -> None:
        waiters, self._waiters = self._waiters, set()
        for fut in waiters:
            if not fut.done():
                with contextlib.suppress(RuntimeError):  # its event loop is closed
                    fut.set_result(None)

    async def wait(self, timeout_s: float) -> None:
        """Until the next ``notify`` or ``timeout_s`` seconds."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._waiters.add(fut)
        timer = loop.call_later(timeout_s, _wake, fut)
        try:
            await fut
        finally:
            timer.cancel()
            self._waiters.discard(fut)


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class MemoryTransport:
    """An ``HttpTransport`` for every client of one ``TestBroker`` (see the module doc).
    Closing a client does not close it: the broker outlives its clients."""

    def __init__(self, store: MemoryStore, transactions: MemoryTransactions,
                 simple: MemorySimple, signal: Signal, *, nameserver_url: str,
                 broker_url: str) -> None:
        self.store = store
        self.tx = transactions
        self.simple = simple
        self.signal = signal
        self.nameserver_url = nameserver_url
        self.broker_url = broker_url
        self.requests = 0  # answered so far

    async def request(self, method: str, url: str, *, headers: Mapping[str, str],
                      content: bytes | None, params: Params | None,
                      timeout_s: float) -> TransportResponse:
        parts = urlsplit(url)
        origin = f"{parts.scheme}://{parts.netloc}"
        query = {k: str(v) for k, v in (params or {}).items()}
        query.update(parse_qsl(parts.query))
        path = [unquote(p) for p in parts.path.strip("/").split("/") if p]
        lowered = {k.lower(): v for k, v in headers.items()}
        accept = lowered.get("accept", CONTENT_JSON)
        self.requests += 1
        try:
            if origin not in (self.nameserver_url, self.broker_url):
                raise WireConnectError(f"nothing listens on {origin}: this TestBroker "
                                       f"serves {self.nameserver_url} and {self.broker_url}")
            batch = as_messages(content) \
                if content and is_batch(lowered.get("content-type")) else None
            body = {"messages": [m.to_wire(binary=True) for m in batch]} if batch is not None \
                else TransportRequest(method.upper(), url, lowered, content, query).payload()
            self.store.deliver_due()
            if origin == self.nameserver_url:
                answer = self._nameserver(method.upper(), path)
            else:
                answer = await self._broker(method.upper(), path, query, body, batch)
        except ProtocolError as exc:
            return TransportResponse.encoded(exc.code.http_status, exc.to_wire())
        except _NotFound:
            return TransportResponse.encoded(404, {"detail": "Not Found"})
        finally:
            if method.upper() != "GET":
                self.signal.notify()
        if isinstance(answer, _Error):
            return TransportResponse.encoded(answer.status, answer.payload)
        if "msgpack" in accept:
            return TransportResponse.encoded(200, answer, content_type=CONTENT_MSGPACK)
        return TransportResponse.encoded(200, _jsonable(answer))

    async def aclose(self) -> None:
        """Nothing to release (every client shares this transport)."""

    # -- nameserver --------------------------------------------------------------------------

    def _nameserver(self, method: str, path: list[str]) -> Any:
        if path == ["healthz"]:
            return {"status": "ok"}
        if method == "GET" and path[:2] == ["v1", "routes"] and len(path) == 3:
            if path[2].startswith(RETRY_PREFIX) and path[2] not in self.store.topics:
                # a consumer asks for its group's retry topic at its start: it is there at
                # once (the real broker makes it with the group's first retry, and the
                # consumer finds it at a later rebalance)
                self.store.create_topic(path[2], 1, system=True)
            topic = self.store.topics.get(path[2])
            if topic is None:
                raise ProtocolError(ErrorCode.TOPIC_NOT_FOUND, f"no route for topic "
                                    f"{path[2]!r}: create it first")
            return {"topic": topic.name, "queues": [
                {"broker_name": BROKER_NAME, "address": self.broker_url,
                 "queues": len(topic.queues), "perm": topic.perm, "replicas": []}]}
        if method == "GET" and path == ["v1", "cluster"]:
            return {"brokers": [{"cluster": CLUSTER, "broker_name": BROKER_NAME,
                                 "address": self.broker_url, "broker_id": 0, "role": "primary",
                                 "epoch": 0, "grpc_address": None,
                                 "last_heartbeat_ms": int(time.time() * 1000),
                                 "topics": {n: {"queues": len(t.queues), "perm": t.perm}
                                            for n, t in self.store.topics.items()}}],
                    "nameservers": [self.nameserver_url]}
        raise _NotFound

    # -- broker ------------------------------------------------------------------------------

    async def _broker(self, method: str, path: list[str], query: dict[str, str], body: Any,
                      batch: list[OutgoingMessage] | None) -> Any:
        """``batch``: the messages of a request of record batches (``body`` is their
        msgpack form)."""
        if path == ["healthz"]:
            return {"status": "ok"}
        if path[:1] != ["v1"] or len(path) < 2:
            raise _NotFound
        what, rest = path[1], path[2:]
        if what == "topics":
            return await self._topics(method, rest, query, body, batch)
        if what == "pull" and method == "POST" and not rest:
            return await self._pull_many(_obj(body))
        if what == "groups" and len(rest) >= 2:
            return await self._groups(method, validate_group_name(rest[0]), rest[1:], query,
                                      _obj({} if body is None else body))
        if what == "transactions":
            return self._transactions(method, rest, query, body, batch)
        if what == "producers" and len(rest) >= 2:
            return await self._producers(method, rest[0], rest[1:], query, body)
        if what == "messages":
            return self._messages(method, rest, query)
        if what == "scheduled" and method == "GET" and not rest:
            return self.store.pending_delays(query.get("topic"))
        raise _NotFound

    async def _topics(self, method: str, rest: list[str], query: dict[str, str], body: Any,
                      batch: list[OutgoingMessage] | None) -> Any:
        s = self.store
        if not rest and method == "GET":
            return {"topics": [t.info() for t in s.topics.values()]}
        if len(rest) == 1 and method == "PUT":
            b = _obj(body)
            return s.create_topic(rest[0], b.get("queues", 8), str(b.get("perm", "rw")))
        if len(rest) == 1 and method == "GET":
            return s.topic(rest[0]).info()
        if rest[1:] == ["messages"] and method == "POST":
            s.writable(rest[0])  # 404 / 403 before the body's problems, as the broker does
            return {"results": s.send(rest[0], parse_messages(body))}
        if len(rest) == 4 and rest[1] == "queues" and rest[3] == "messages" and method == "GET":
            topic, queue_id = rest[0], _int(rest[2], "queue_id", 0)
            offset = _int(query.get("offset", "0"), "offset", 0)
            limit = _int(query.get("max", "32"), "max", 1, 1024)
            tags = query.get("tags", "*")

            def read() -> dict[str, Any] | None:
                answer = s.read(topic, queue_id, offset, limit, tags)
                return answer if answer["next_offset"] != offset else None

            got = await self._long_poll(read, query.get("wait_ms", "0"))
            return got if got is not None else s.read(topic, queue_id, offset, limit, tags)
        raise _NotFound

    async def _pull_many(self, body: dict[str, Any]) -> Any:
        asks = body.get("queues")
        if not isinstance(asks, list) or not asks:
            raise ProtocolError(ErrorCode.BAD_REQUEST, "queues: a list of 1-1024 queues")
        limit = _int(body.get("max", 32), "max", 1, 1024)

        def poll() -> list[dict[str, Any]]:
            entries = []
            for ask in asks:
                topic, queue_id = str(ask.get("topic")), ask.get("queue_id")
                offset = int(ask.get("offset", 0))
                try:
                    answer = self.store.read(topic, _int(queue_id, "queue_id", 0), offset,
                                             limit, str(ask.get("tags", "*")))
                except ProtocolError as exc:
                    entries.append({"topic": topic, "queue_id": queue_id,
                                    "error": exc.to_wire()})
                    continue
                if answer["next_offset"] != offset:
                    entries.append({"topic": topic, "queue_id": queue_id, **answer})
            return entries

        return {"queues": await self._long_poll(poll, body.get("wait_ms", 0)) or []}

    async def _groups(self, method: str, group: str, rest: list[str], query: dict[str, str],
                      body: dict[str, Any]) -> Any:
        s = self.store
        what = rest[0]
        if what == "heartbeat" and method == "POST":
            return {"members": s.heartbeat(group, validate_client_id(body.get("client_id")))}
        if what == "members" and method == "DELETE" and len(rest) == 2:
            s.members.get(group, {}).pop(rest[1], None)
            return {}
        if what == "offsets" and method == "PUT":
            s.commit(group, _list(body, "offsets"), bool(body.get("advance_only")))
            return {}
        if what == "offsets" and method == "GET":
            return {"offsets": s.committed(group, query.get("topic"))}
        if what == "retry" and method == "POST":
            return {"destination": s.retry(group, str(body.get("message_id", "")),
                                           body.get("delay_level"), body.get("reason"))}
        if what == "receive" and method == "POST":
            topic = str(body.get("topic", ""))
            s.topic(topic)
            tags, limit = str(body.get("tags", "*")), _int(body.get("max", 16), "max", 1, 1024)
            invisible = _int(body.get("invisible_ms", 30_000), "invisible_ms", 1)
            got = await self._long_poll(
                lambda: self.simple.receive(group, topic, tags, limit, invisible),
                body.get("wait_ms", 20_000))
            return {"messages": got or []}
        if what == "ack" and method == "POST":
            return {"acked": self.simple.ack(group, _list(body, "receipt_handles"))}
        if what == "invisibility" and method == "POST":
            invisible = _int(body.get("invisible_ms"), "invisible_ms", 0)
            return {"receipt_handle": self.simple.change_invisibility(
                group, body.get("receipt_handle"), invisible)}
        raise _NotFound

    def _transactions(self, method: str, rest: list[str], query: dict[str, str], body: Any,
                      batch: list[OutgoingMessage] | None) -> Any:
        tx = self.tx
        if method == "GET" and not rest:
            return {"transactions": tx.pending(query.get("producer_group"))}
        if method == "GET" and len(rest) == 1:
            return tx.get(rest[0])
        if method != "POST":
            raise _NotFound
        if batch is not None and not rest:  # half copies: reserved properties included
            halves = tx.prepare(query.get("producer_group", ""), query.get("topic", ""), batch,
                                None)
            if all(new for _, _, new in halves):
                return {"stored": len(halves)}
            return {"transactions": [{"transaction_id": t, "message_id": m}
                                     for t, m, _ in halves]}
        b = _obj(body)
        if rest == ["end"]:
            return {"results": tx.end_many(str(b.get("producer_group", "")),
                                           _list(b, "ends"))}
        if len(rest) == 2 and rest[1] == "end":
            return {"state": tx.end(str(b.get("producer_group", "")), rest[0],
                                    str(b.get("action")))}
        if rest:
            raise _NotFound
        group, topic = str(b.get("producer_group", "")), str(b.get("topic", ""))
        single = "message" in b
        messages = [parse_message(b["message"])] if single else parse_messages(
            {"messages": b.get("messages")})
        immunity = b.get("check_immunity_s")
        halves = tx.prepare(group, topic, messages,
                            None if immunity is None else float(immunity))
        made = [{"transaction_id": t, "message_id": m} for t, m, _ in halves]
        answer: dict[str, Any] = made[0] if single else {"transactions": made}
        if b.get("ends"):
            answer["results"] = tx.end_many(group, _list(b, "ends"))
        return answer

    async def _producers(self, method: str, group: str, rest: list[str],
                         query: dict[str, str], body: Any) -> Any:
        if rest == ["heartbeat"] and method == "POST":
            self.tx.heartbeat(group, validate_client_id(_obj(body).get("client_id")))
            return {}
        if rest[0] == "members" and method == "DELETE" and len(rest) == 2:
            self.tx.leave(group, rest[1])
            return {}
        if rest == ["checks"] and method == "GET":
            client = validate_client_id(query.get("client_id"))
            limit = _int(query.get("max", "256"), "max", 1, 1024)
            got = await self._long_poll(lambda: self.tx.checks(group, client, limit),
                                        query.get("wait_ms", "20000"))
            return {"checks": got or []}
        raise _NotFound

    def _messages(self, method: str, rest: list[str], query: dict[str, str]) -> Any:
        s = self.store
        if method == "GET" and not rest:
            return {"messages": s.query(
                query.get("topic", ""), query.get("key"),
                _int(query["begin_ms"], "begin_ms", 0) if "begin_ms" in query else None,
                _int(query["end_ms"], "end_ms", 0) if "end_ms" in query else None,
                _int(query.get("max", "64"), "max", 1, 1024))}
        if method == "GET" and len(rest) == 1:
            state, copy = s.find(rest[0])
            return copy.wire(state=state)
        if method == "DELETE" and len(rest) == 2 and rest[1] == "schedule":
            answer = s.cancel(rest[0], query.get("topic"))
            return _Error(409, answer["error"]) if "error" in answer else answer
        raise _NotFound

    # -- long polls --------------------------------------------------------------------------

    async def _long_poll(self, poll: Callable[[], Any], wait_ms: object) -> Any:
        """``poll()`` until it answers something (not empty) or ``wait_ms`` (real time, cut
        to ``MAX_WAIT_MS``) passes; then its last answer."""
        wait = _int(wait_ms, "wait_ms", 0)
        deadline = time.monotonic() + min(wait, MAX_WAIT_MS) / 1000
        while True:
            self.store.deliver_due()
            got = poll()
            left = deadline - time.monotonic()
            if got or left <= 0:
                return got
            await self.signal.wait(left)


class _NotFound(Exception):
    """A path the services do not serve: FastAPI's plain 404 without an API code."""


class _Error:
    """An error answer whose code this SDK version has no ``ErrorCode`` for."""

    def __init__(self, status: int, payload: dict[str, Any]) -> None:
        self.status = status
        self.payload = payload


def _obj(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ProtocolError(ErrorCode.BAD_REQUEST, "the body must be a JSON object")
    return body


def _list(body: dict[str, Any], name: str) -> list[Any]:
    value = body.get(name)
    if not isinstance(value, list):
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"{name}: must be a list")
    return value


def _int(value: object, name: str, low: int, high: int | None = None) -> int:
    try:
        number = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"{name}: must be an integer, got "
                            f"{value!r}") from None
    if number < low or (high is not None and number > high):
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"{name}: must be {low}-{high or 'up'}, "
                            f"got {number}")
    return number


def _jsonable(value: Any) -> Any:
    """An answer for JSON: every ``bytes`` body as utf-8 text, or base64 with
    ``body_encoding``."""
    if isinstance(value, dict):
        out = {k: _jsonable(v) for k, v in value.items()}
        body = value.get("body")
        if isinstance(body, bytes):
            try:
                out["body"] = body.decode("utf-8")
            except UnicodeDecodeError:
                out["body"] = base64.b64encode(body).decode("ascii")
                out["body_encoding"] = "base64"
        return out
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value

