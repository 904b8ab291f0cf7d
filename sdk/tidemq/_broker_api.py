"""Typed calls to the broker's consumer endpoints (docs/api.md, "Broker"): one place spells each
path.

Message endpoints (pull, receive) speak msgpack; the rest JSON. Long polls get a timeout of
their wait plus the client's normal request timeout. Pulls ask for the stored form: the records
as the broker's log holds them (``tidemq.protocol.records.stored``), decoded lazily into
``StoredMessage`` objects; a broker that answers with messages is read as before, and one that
refuses the ``form`` field of a multi-queue pull is asked again without it from then on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tidemq._exceptions import ServerError, UnexpectedResponseError, server_error
from tidemq._http import HttpClient, RetryPolicy, url
from tidemq._routes import MessageQueue
from tidemq.protocol import MAX_CONSUME_FAILURE_CHARS, ReceivedMessage
from tidemq.protocol.records.stored import decode_stored
from tidemq.protocol.records.v2_read import BatchError
from tidemq.protocol.topics import DLQ_PREFIX, RETRY_PREFIX


@dataclass(frozen=True, slots=True)
class PullResult:
    messages: list[ReceivedMessage]
    next_offset: int
    min_offset: int
    max_offset: int
    origin_topics: dict[int, str] = field(default_factory=dict)  # queue offset → original topic


@dataclass(frozen=True, slots=True)
class QueueOffsets:
    """``GET /v1/topics/{topic}`` offsets of one queue: first stored and next to be written."""

    queue_id: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class QueueAsk:
    """One queue of a multi-queue pull: where to read from and which tags."""

    queue: MessageQueue
    offset: int
    tags: str


def _pull_result(answer: Any, where: object, topic: str) -> PullResult:
    stored = answer.get("stored") if isinstance(answer, dict) else None
    if stored is not None:
        try:
            messages: list[ReceivedMessage] = list(decode_stored(stored))
        except (BatchError, TypeError) as exc:
            raise UnexpectedResponseError(f"malformed stored pull answer for {where}: "
                                          f"{exc}") from exc
        # only a retry or DLQ copy has an origin topic (reading it decodes its properties)
        origins = {m.queue_offset: m.origin_topic for m in messages if m.origin_topic} \
            if topic.startswith((RETRY_PREFIX, DLQ_PREFIX)) else {}
    else:
        messages = _messages(answer, str(where))
        # A retry/DLQ copy names the topic it was first sent to ("origin_topic", not a field
        # of ReceivedMessage): kept aside so the push consumer can show that topic.
        origins = {m.queue_offset: str(raw["origin_topic"])
                   for m, raw in zip(messages, answer.get("messages") or [], strict=True)
                   if raw.get("origin_topic")}
    try:
        return PullResult(messages, int(answer["next_offset"]),
                          int(answer.get("min_offset", 0)),
                          int(answer.get("max_offset", answer["next_offset"])), origins)
    except (KeyError, TypeError, ValueError) as exc:
        raise UnexpectedResponseError(f"malformed pull answer for {where}: {exc!r}") from exc


def _messages(payload: Any, where: str) -> list[ReceivedMessage]:
    try:
        return [ReceivedMessage.from_wire(m) for m in payload.get("messages") or []]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UnexpectedResponseError(f"malformed messages from {where}: {exc!r}") from exc


class BrokerApi:
    """The consumer side of one or many brokers; every call names its broker's address."""

    def __init__(self, http: HttpClient) -> None:
        self.http = http

    def _long_poll_timeout(self, wait_ms: int) -> float:
        return wait_ms / 1000.0 + self.http.timeout_s

    async def pull(
        self, queue: MessageQueue, *, offset: int, max_messages: int, wait_ms: int, tags: str,
        group: str | None, retry: RetryPolicy | None = None,
    ) -> PullResult:
        params: dict[str, str | int] = {"offset": offset, "max": max_messages,
                                        "wait_ms": wait_ms, "tags": tags, "form": "stored"}
        if group:
            params["group"] = group
        target = url(queue.address, "v1", "topics", queue.topic, "queues", queue.queue_id,
                     "messages")
        answer = await self.http.call("GET", target, params=params, binary=True,
                                      timeout_s=self._long_poll_timeout(wait_ms), retry=retry)
        return _pull_result(answer, queue, queue.topic)

    async def pull_many(
        self, broker: str, asks: Sequence[QueueAsk], *, max_messages: int, wait_ms: int,
        group: str | None, retry: RetryPolicy | None = None,
    ) -> list[tuple[MessageQueue, PullResult | ServerError]]:
        """``POST /v1/pull``: one long poll over ``asks`` (queues of ``broker``); the queues
        with news, each with its result or its own error (the others have nothing yet)."""
        by_key = {(a.queue.topic, a.queue.queue_id): a.queue for a in asks}
        body: dict[str, Any] = {
            "queues": [{"topic": a.queue.topic, "queue_id": a.queue.queue_id,
                        "offset": a.offset, "tags": a.tags} for a in asks],
            "max": max_messages, "wait_ms": wait_ms, "form": "stored"}
        if group:
            body["group"] = group
        answer = await self.http.call("POST", url(broker, "v1", "pull"), body=body, binary=True,
                                      timeout_s=self._long_poll_timeout(wait_ms), retry=retry)
        out: list[tuple[MessageQueue, PullResult | ServerError]] = []
        try:
            entries = answer["queues"]
            for entry in entries:
                queue = by_key.get((entry["topic"], int(entry["queue_id"])))
                if queue is None:
                    continue  # not asked for: nothing of ours
                error = entry.get("error")
                if error:
                    out.append((queue, server_error(str(error["code"]),
                                                    str(error.get("message", "")))))
                else:
                    out.append((queue, _pull_result(entry, queue, queue.topic)))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise UnexpectedResponseError(f"malformed multi-queue pull answer from {broker}: "
                                          f"{exc!r}") from exc
        return out

    async def topic_offsets(self, broker: str, topic: str) -> dict[int, QueueOffsets]:
        answer = await self.http.call("GET", url(broker, "v1", "topics", topic))
        try:
            return {int(o["queue_id"]): QueueOffsets(int(o["queue_id"]), int(o["min"]),
                                                     int(o["max"]))
                    for o in answer.get("offsets") or []}
        except (KeyError, TypeError, ValueError) as exc:
            raise UnexpectedResponseError(f"malformed topic answer for {topic!r}: {exc!r}") from exc

    async def heartbeat(
        self, broker: str, group: str, *, client_id: str, subscriptions: Mapping[str, str],
        mode: str, retry: RetryPolicy | None = None,
    ) -> list[str]:
        answer = await self.http.call(
            "POST", url(broker, "v1", "groups", group, "heartbeat"),
            body={"client_id": client_id, "subscriptions": dict(subscriptions), "mode": mode},
            retry=retry)
        members = answer.get("members") if isinstance(answer, dict) else None
        if not isinstance(members, list):
            raise UnexpectedResponseError(f"heartbeat answer from {broker} has no member list")
        return sorted(str(m) for m in members)

    async def leave(self, broker: str, group: str, client_id: str,
                    retry: RetryPolicy | None = None) -> None:
        await self.http.call("DELETE", url(broker, "v1", "groups", group, "members", client_id),
                             retry=retry)

    async def committed_offsets(self, broker: str, group: str, topic: str) -> dict[int, int]:
        """Queue id → committed offset of ``group`` on ``topic`` (empty for a new group)."""
        answer = await self.http.call("GET", url(broker, "v1", "groups", group, "offsets"),
                                      params={"topic": topic})
        try:
            return {int(o["queue_id"]): int(o["offset"]) for o in answer.get("offsets") or []
                    if o.get("topic", topic) == topic}
        except (KeyError, TypeError, ValueError) as exc:
            raise UnexpectedResponseError(f"malformed offsets answer: {exc!r}") from exc

    async def commit_offsets(
        self, broker: str, group: str, offsets: Sequence[tuple[str, int, int]],
        retry: RetryPolicy | None = None,
    ) -> None:
        """Commit ``(topic, queue_id, offset)`` triples (each the next offset to consume); a
        consumer's commit only moves offsets forward (a late retry never undoes a newer one)."""
        await self.http.call(
            "PUT", url(broker, "v1", "groups", group, "offsets"),
            body={"offsets": [{"topic": t, "queue_id": q, "offset": o} for t, q, o in offsets],
                  "advance_only": True},
            retry=retry)

    async def send_to_retry(self, broker: str, group: str, message_id: str,
                            delay_level: int | None = None, reason: str | None = None) -> str:
        """Hand a failed message back: the broker puts it on ``%RETRY%group`` or the DLQ,
        with ``reason`` (cut to fit) in the copy's ``TIDE_CONSUME_FAILURE`` property."""
        body: dict[str, Any] = {"message_id": message_id}
        if delay_level:
            body["delay_level"] = delay_level
        if reason:
            body["reason"] = reason[:MAX_CONSUME_FAILURE_CHARS]
        answer = await self.http.call("POST", url(broker, "v1", "groups", group, "retry"),
                                      body=body)
        return str(answer.get("destination", "")) if isinstance(answer, dict) else ""

    async def receive(
        self, broker: str, group: str, *, topic: str, tags: str, max_messages: int,
        invisible_ms: int, wait_ms: int, retry: RetryPolicy | None = None,
    ) -> list[ReceivedMessage]:
        answer = await self.http.call(
            "POST", url(broker, "v1", "groups", group, "receive"),
            body={"topic": topic, "tags": tags, "max": max_messages,
                  "invisible_ms": invisible_ms, "wait_ms": wait_ms},
            binary=True, timeout_s=self._long_poll_timeout(wait_ms), retry=retry)
        return _messages(answer, broker)

    async def ack(self, broker: str, group: str, handles: Sequence[str]) -> int:
        answer = await self.http.call("POST", url(broker, "v1", "groups", group, "ack"),
                                      body={"receipt_handles": list(handles)})
        return int(answer.get("acked", 0)) if isinstance(answer, dict) else 0

    async def change_invisibility(self, broker: str, group: str, handle: str,
                                  invisible_ms: int) -> str:
        answer = await self.http.call(
            "POST", url(broker, "v1", "groups", group, "invisibility"),
            body={"receipt_handle": handle, "invisible_ms": invisible_ms})
        try:
            return str(answer["receipt_handle"])
        except (KeyError, TypeError) as exc:
            raise UnexpectedResponseError(f"invisibility answer has no receipt_handle: {exc!r}") \
                from exc
