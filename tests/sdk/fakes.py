"""An in-memory broker and nameserver behind ``httpx.MockTransport``, for SDK unit tests.

Just enough of docs/api.md for the SDK: topics, send (with dedup by message id), pull (with a short
long-poll), group heartbeat / leave / offsets / retry, simple-consumer receive / ack /
invisibility, half messages and their ends, producer heartbeats and (empty) check polls, and
nameserver routes and cluster view. Every request is recorded; ``fail_next`` queues canned error
answers for a path prefix. A send of record format v2 batches (the SDK's producer) is recorded
as the ``{"messages": [...]}`` body a msgpack send of the same messages would have (its
``content_type`` says which came); ``batches_refused`` answers such a send 415 instead.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import httpx
from tidemq.protocol import (
    ErrorCode,
    ProtocolError,
    decode_payload,
    encode_payload,
    parse_messages,
    retry_topic,
)
from tidemq.protocol.records.v2 import CONTENT_BATCH
from tidemq.protocol.records.v2_read import as_messages

from tests.support.clock import now_ms


def request_payload(content: bytes, content_type: str | None) -> Any:
    """A request body decoded: JSON, msgpack, or record batches (as ``batch_body``)."""
    if content_type == CONTENT_BATCH:
        return batch_body(content)
    return decode_payload(content, content_type)


def batch_body(raw: bytes) -> dict[str, Any]:
    """A request of record format v2 batches as the msgpack send body of its messages."""
    return {"messages": [m.to_wire(binary=True) for m in as_messages(raw)]}


@dataclass
class Recorded:
    method: str
    host: str
    path: str
    params: dict[str, str]
    content_type: str | None
    body: Any


@dataclass
class Canned:
    status: int
    code: str
    message: str = "canned failure"
    headers: dict[str, str] = field(default_factory=dict)


class FakeBroker:
    """One broker's state."""

    def __init__(self, name: str, address: str, *, long_poll_cap_s: float = 0.05) -> None:
        self.name = name
        self.address = address
        self.long_poll_cap_s = long_poll_cap_s
        self.filter_tags = True  # False: let every tag through, as a tag-hash collision would
        self.queues: dict[str, list[list[dict[str, Any]]]] = {}
        self.dedup: dict[tuple[str, str], dict[str, Any]] = {}
        self.members: dict[str, dict[str, float]] = {}  # group → client → last heartbeat
        self.heartbeats: list[dict[str, Any]] = []
        self.offsets: dict[tuple[str, str, int], int] = {}  # (group, topic, queue) → offset
        self.retried: list[tuple[str, str]] = []  # (group, message_id)
        self.inflight: dict[str, dict[str, Any]] = {}  # receipt handle → message
        self.acked: list[str] = []
        self.halves: dict[str, dict[str, Any]] = {}  # transaction id → {message_id, topic}
        self.ends: list[dict[str, Any]] = []
        self._handles = itertools.count(1)
        self._cursor: dict[tuple[str, str], int] = {}

    # -- state helpers ---------------------------------------------------------------------

    def create_topic(self, topic: str, queues: int = 4) -> None:
        self.queues.setdefault(topic, [[] for _ in range(queues)])

    def put(self, topic: str, queue_id: int, body: bytes, *, tag: str | None = None,
            message_id: str | None = None, **extra: Any) -> dict[str, Any]:
        queue = self.queues[topic][queue_id]
        now = now_ms()
        message = {"message_id": message_id or f"m-{topic}-{queue_id}-{len(queue)}",
                   "topic": topic, "queue_id": queue_id, "queue_offset": len(queue),
                   "body": body, "tag": tag, "keys": [], "properties": {},
                   "born_timestamp_ms": now, "store_timestamp_ms": now, "reconsume_times": 0}
        message.update(extra)
        queue.append(message)
        return message

    def all_messages(self, topic: str) -> list[dict[str, Any]]:
        return [m for q in self.queues.get(topic, []) for m in q]

    def find(self, message_id: str) -> dict[str, Any] | None:
        for topic in self.queues:
            for m in self.all_messages(topic):
                if m["message_id"] == message_id:
                    return m
        return None

    # -- endpoints -------------------------------------------------------------------------

    async def handle(self, method: str, parts: list[str], params: dict[str, str],
                     body: Any) -> Any:
        if parts[:2] == ["v1", "topics"] and len(parts) == 3 and method == "GET":
            return self._topic(parts[2])
        if parts[:2] == ["v1", "topics"] and parts[3:] == ["messages"]:
            return self._send(parts[2], body)
        if parts[:2] == ["v1", "topics"] and parts[3] == "queues":
            return await self._pull(parts[2], int(parts[4]), params)
        if parts == ["v1", "pull"] and method == "POST":
            return await self._pull_many(body)
        if parts[:2] == ["v1", "groups"]:
            return self._group(method, parts[2], parts[3:], params, body)
        if parts[:2] == ["v1", "transactions"]:
            return self._transactions(parts[2:], body, params)
        if parts[:2] == ["v1", "producers"]:
            if parts[-1] == "checks":
                await asyncio.sleep(self.long_poll_cap_s)
                return {"checks": []}
            return {}
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"fake broker: no route {method} {parts}")

    def _topic(self, topic: str) -> Any:
        if topic not in self.queues:
            raise ProtocolError(ErrorCode.TOPIC_NOT_FOUND, f"no topic {topic}")
        qs = self.queues[topic]
        return {"name": topic, "queues": len(qs), "perm": "rw",
                "offsets": [{"queue_id": i, "min": 0, "max": len(q)} for i, q in enumerate(qs)]}

    def _send(self, topic: str, body: Any) -> Any:
        if topic not in self.queues:
            raise ProtocolError(ErrorCode.TOPIC_NOT_FOUND, f"no topic {topic}")
        messages = parse_messages(body)
        results = []
        for wire, m in zip(body["messages"], messages, strict=True):
            assert m.message_id, "the SDK must always set a message id"
            key = (topic, m.message_id)
            if key not in self.dedup:
                queue_id = (m.queue_id if m.queue_id is not None  # as the broker picks it
                            else zlib.crc32(m.sharding_key.encode()) % len(self.queues[topic])
                            if m.sharding_key is not None else 0)
                stored = self.put(topic, queue_id, m.body, tag=m.tag, message_id=m.message_id,
                                  keys=m.keys, properties=m.properties, wire=wire)
                self.dedup[key] = {"message_id": m.message_id, "queue_id": queue_id,
                                   "queue_offset": stored["queue_offset"]}
            results.append(self.dedup[key])
        return {"results": results}

    async def _pull(self, topic: str, queue_id: int, params: dict[str, str]) -> Any:
        if topic not in self.queues:
            raise ProtocolError(ErrorCode.TOPIC_NOT_FOUND, f"no topic {topic}")
        queue = self.queues[topic][queue_id]
        offset, limit = int(params["offset"]), int(params.get("max", 32))
        if offset > len(queue):
            raise ProtocolError(ErrorCode.OFFSET_OUT_OF_RANGE, f"{offset} > {len(queue)}")
        if offset == len(queue):
            wait = min(int(params.get("wait_ms", 0)) / 1000, self.long_poll_cap_s)
            await asyncio.sleep(wait)
        tags = params.get("tags", "*")
        wanted = None
        if tags != "*" and self.filter_tags:
            wanted = {t.strip() for t in tags.split("||")}
        out = []
        next_offset = offset
        for m in queue[offset:offset + limit]:
            next_offset = m["queue_offset"] + 1
            if wanted is None or m["tag"] in wanted:
                out.append({k: v for k, v in m.items() if k != "wire"})
        return {"messages": out, "next_offset": next_offset, "min_offset": 0,
                "max_offset": len(queue)}

    async def _pull_many(self, body: Any) -> Any:
        """``POST /v1/pull``: the queues with news; when none has any, one capped wait. It
        answers messages whatever ``form`` asks (as a broker may)."""
        limit = body.get("max", 32)
        wait_ms = int(body.get("wait_ms", 0))
        for attempt in range(2):
            entries = []
            for ask in body["queues"]:
                topic, queue_id, offset = ask["topic"], ask["queue_id"], ask["offset"]
                params = {"offset": str(offset), "max": str(limit), "tags": ask.get("tags", "*")}
                try:
                    answer = await self._pull(topic, queue_id, params)
                except ProtocolError as exc:
                    entries.append({"topic": topic, "queue_id": queue_id,
                                    "error": exc.to_wire()})
                    continue
                if answer["messages"] or answer["next_offset"] != offset:
                    entries.append({"topic": topic, "queue_id": queue_id, **answer})
            if entries or attempt:
                return {"queues": entries}
            await asyncio.sleep(min(wait_ms / 1000, self.long_poll_cap_s))
        raise AssertionError("unreachable")

    def _group(self, method: str, group: str, rest: list[str], params: dict[str, str],
               body: Any) -> Any:
        what = rest[0]
        if what == "heartbeat":
            self.heartbeats.append(body)
            self.members.setdefault(group, {})[body["client_id"]] = time.monotonic()
            return {"members": sorted(self.members[group])}
        if what == "members" and method == "DELETE":
            self.members.get(group, {}).pop(rest[1], None)
            return {}
        if what == "offsets" and method == "PUT":
            for o in body["offsets"]:
                self.offsets[(group, o["topic"], o["queue_id"])] = o["offset"]
            return {}
        if what == "offsets":
            topic = params["topic"]
            return {"offsets": [{"topic": t, "queue_id": q, "offset": o, "max_offset": 0, "lag": 0}
                                for (g, t, q), o in sorted(self.offsets.items())
                                if g == group and t == topic]}
        if what == "retry":
            return self._retry(group, body["message_id"])
        if what == "receive":
            return self._receive(group, body)
        if what == "ack":
            handles = body["receipt_handles"]
            self.acked.extend(handles)
            return {"acked": sum(1 for h in handles if self.inflight.pop(h, None) is not None)}
        if what == "invisibility":
            if body["receipt_handle"] not in self.inflight:
                raise ProtocolError(ErrorCode.INVALID_RECEIPT_HANDLE, "unknown handle")
            message = self.inflight.pop(body["receipt_handle"])
            new = f"h{next(self._handles)}"
            self.inflight[new] = message
            return {"receipt_handle": new}
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"fake broker: no group route {rest}")

    def _transactions(self, rest: list[str], body: Any, params: dict[str, str]) -> Any:
        if rest == ["end"]:
            self.ends.extend(body["ends"])
            return {"results": [{"transaction_id": e["transaction_id"], "state": "committed"}
                                for e in body["ends"]]}
        topic = body.get("topic") or params.get("topic")  # a batch of halves names it in the query
        if topic not in self.queues:
            raise ProtocolError(ErrorCode.TOPIC_NOT_FOUND, f"no topic {topic}")
        out = []
        for m in body["messages"]:
            txid = next((t for t, h in self.halves.items()
                         if h["message_id"] == m["message_id"]), None)  # dedup by message id
            if txid is None:
                txid = f"{self.name}-tx{len(self.halves)}"
                self.halves[txid] = {"message_id": m["message_id"], "topic": topic}
            out.append({"transaction_id": txid, "message_id": m["message_id"]})
        self.ends.extend(body.get("ends") or [])
        answer: dict[str, Any] = {"transactions": out}
        if body.get("ends"):
            answer["results"] = [{"transaction_id": e["transaction_id"], "state": "committed"}
                                 for e in body["ends"]]
        return answer

    def _retry(self, group: str, message_id: str) -> Any:
        original = self.find(message_id)
        if original is None:
            raise ProtocolError(ErrorCode.MESSAGE_NOT_FOUND, message_id)
        self.retried.append((group, message_id))
        topic = retry_topic(group)
        self.create_topic(topic, 1)
        self.put(topic, 0, original["body"], tag=original["tag"], message_id=message_id,
                 origin_topic=original["topic"],
                 reconsume_times=original["reconsume_times"] + 1)
        return {"destination": topic}

    def _receive(self, group: str, body: Any) -> Any:
        topic = body["topic"]
        out: list[dict[str, Any]] = []
        for queue_id, queue in enumerate(self.queues.get(topic, [])):
            cursor = self._cursor.get((group, f"{topic}#{queue_id}"), 0)
            for m in queue[cursor:]:
                if len(out) >= body["max"]:
                    break
                handle = f"h{next(self._handles)}"
                self.inflight[handle] = m
                out.append({**{k: v for k, v in m.items() if k != "wire"},
                            "receipt_handle": handle})
                cursor += 1
            self._cursor[(group, f"{topic}#{queue_id}")] = cursor
        return {"messages": out}


class FakeCluster:
    """Brokers and nameservers by address; ``transport`` serves them all."""

    def __init__(self, brokers: int = 1, nameservers: int = 1) -> None:
        self.brokers = {f"http://broker{i}:10911": FakeBroker(f"broker-{i}",
                                                              f"http://broker{i}:10911")
                        for i in range(brokers)}
        self.nameservers = [f"http://ns{i}:9876" for i in range(nameservers)]
        self.down: set[str] = set()  # addresses that refuse connections
        self.requests: list[Recorded] = []
        self._canned: list[tuple[str, Canned]] = []
        self._lose: list[str] = []
        self.batches_refused = False  # True: a send of record batches is 415
        self.transport = httpx.MockTransport(self._serve)

    @property
    def broker(self) -> FakeBroker:
        return next(iter(self.brokers.values()))

    @property
    def broker_url(self) -> str:
        return next(iter(self.brokers))

    def create_topic(self, topic: str, queues: int = 4) -> None:
        for b in self.brokers.values():
            b.create_topic(topic, queues)

    def fail_next(self, path_prefix: str, *answers: Canned) -> None:
        """Answer the next requests whose path starts with ``path_prefix`` with ``answers``."""
        self._canned.extend((path_prefix, a) for a in answers)

    def lose_answer_next(self, path_prefix: str) -> None:
        """Process the next matching request, then fail it as if the connection broke."""
        self._lose.append(path_prefix)

    def requests_to(self, path_prefix: str, method: str | None = None) -> list[Recorded]:
        return [r for r in self.requests if r.path.startswith(path_prefix)
                and (method is None or r.method == method)]

    def iter_brokers(self) -> Iterator[FakeBroker]:
        return iter(self.brokers.values())

    async def _serve(self, request: httpx.Request) -> httpx.Response:
        origin = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        raw_path = request.url.raw_path.decode().split("?")[0]
        parts = [unquote(p) for p in raw_path.strip("/").split("/")]
        path = "/" + "/".join(parts)
        content_type = request.headers.get("content-type")
        body = request_payload(request.content, content_type) if request.content else None
        params = dict(request.url.params)
        self.requests.append(Recorded(request.method, origin, path, params, content_type, body))
        if origin in self.down:
            raise httpx.ConnectError(f"connection refused: {origin}", request=request)
        accept = request.headers.get("accept", "application/json")
        if content_type == CONTENT_BATCH and self.batches_refused:
            return self._answer(415, {"code": "UNSUPPORTED_MEDIA_TYPE", "message": "fake: no "
                                      "record batches"}, "application/json")
        for i, (prefix, canned) in enumerate(self._canned):
            if path.startswith(prefix):
                del self._canned[i]
                return self._answer(canned.status, {"code": canned.code,
                                                    "message": canned.message},
                                    "application/json", canned.headers)
        try:
            if origin in self.nameservers:
                answer = self._route(parts)
            else:
                answer = await self.brokers[origin].handle(request.method, parts, params, body)
        except ProtocolError as exc:
            return self._answer(exc.code.http_status, exc.to_wire(), "application/json")
        for i, prefix in enumerate(self._lose):
            if path.startswith(prefix):
                del self._lose[i]
                raise httpx.ReadError("connection reset after the request", request=request)
        return self._answer(200, answer, accept)

    def _route(self, parts: list[str]) -> Any:
        if parts[1] == "cluster":
            return {"brokers": [{"broker_name": b.name, "address": b.address}
                                for b in self.brokers.values()],
                    "nameservers": self.nameservers}
        topic = parts[2]
        queues = [{"broker_name": b.name, "address": b.address, "queues": len(b.queues[topic]),
                   "perm": "rw"} for b in self.brokers.values() if topic in b.queues]
        if not queues:
            raise ProtocolError(ErrorCode.TOPIC_NOT_FOUND, f"no route for {topic}")
        return {"topic": topic, "queues": queues}

    @staticmethod
    def _answer(status: int, payload: Any, content_type: str,
                headers: dict[str, str] | None = None) -> httpx.Response:
        ct = "application/msgpack" if "msgpack" in content_type else "application/json"
        return httpx.Response(status, content=encode_payload(payload, ct),
                              headers={"content-type": ct, **(headers or {})})
