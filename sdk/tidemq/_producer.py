"""``Producer``: send messages, coalescing concurrent sends into batched requests.

    async with Producer(nameservers=["http://127.0.0.1:9876"]) as producer:
        result = await producer.send(b"hello", topic="orders", tag="created", keys=["o-42"])
        results = await producer.send_batch("orders", [b"a", b"b"])
        await producer.send_oneway(b"fire and forget", topic="audit")
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

import httpx

from tidemq._batcher import Coalescer
from tidemq._constants import (
    CLOSE_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
    ROUTE_REFRESH_INTERVAL_S,
    SEND_LINGER_MS,
)
from tidemq._exceptions import (
    ClientClosedError,
    ConfigurationError,
    TopicNotFoundError,
    TransportError,
    UnexpectedResponseError,
    server_error,
)
from tidemq._http import DEFAULT_RETRY, HttpClient, RetryPolicy, url
from tidemq._message import Message, SendResult, to_outgoing, wire_size
from tidemq._routes import RouteTable
from tidemq._selector import QueueSelector
from tidemq.protocol import ErrorCode, OutgoingMessage, ProtocolError, validate_topic_name
from tidemq.protocol.message import DEFAULT_LIMITS

log = logging.getLogger("tidemq.producer")

Body = bytes | str


class Producer:
    """Sends messages to the brokers serving a topic; an async context manager.

    Concurrent ``send`` calls for one (broker, topic) are gathered into one request; each
    caller gets its own ``SendResult``. A send goes out at once when no request to its (broker,
    topic) is outstanding; otherwise it waits for that request's answer, at most ``linger_ms``
    (or until ``max_batch`` messages / ``max_batch_bytes``). Every message carries a
    client-generated ``message_id``, so the automatic retries of retriable failures
    (``retry``) can never store a message twice.
    """

    def __init__(
        self,
        *,
        nameservers: Sequence[str] | None = None,
        broker_url: str | None = None,
        linger_ms: float = SEND_LINGER_MS,
        max_batch: int = 256,
        max_batch_bytes: int = 4 * 1024 * 1024,
        max_in_flight: int = 32,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        retry: RetryPolicy = DEFAULT_RETRY,
        route_refresh_s: float = ROUTE_REFRESH_INTERVAL_S,
        close_timeout_s: float = CLOSE_TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        limits = DEFAULT_LIMITS
        if not 1 <= max_batch <= limits.max_batch_messages:
            raise ConfigurationError(
                f"max_batch must be 1-{limits.max_batch_messages}, got {max_batch}")
        if not limits.max_body_bytes <= max_batch_bytes <= limits.max_batch_bytes:
            raise ConfigurationError(f"max_batch_bytes must be {limits.max_body_bytes}-"
                                     f"{limits.max_batch_bytes}, got {max_batch_bytes}")
        if linger_ms < 0 or max_in_flight < 1:
            raise ConfigurationError("linger_ms must be >= 0 and max_in_flight >= 1")
        self._http = HttpClient(transport=transport, timeout_s=request_timeout_s, retry=retry)
        self._routes = RouteTable(self._http, nameservers=nameservers, broker_url=broker_url,
                                  refresh_interval_s=route_refresh_s)
        self._selector = QueueSelector()
        self._coalescer = Coalescer(self._post, linger_s=linger_ms / 1000.0,
                                    max_messages=max_batch, max_bytes=max_batch_bytes,
                                    max_in_flight=max_in_flight)
        self._close_timeout_s = close_timeout_s
        self._valid_topics: set[str] = set()
        self._started = False
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> Producer:
        """Start the background route refresh (``send`` also starts it on first use)."""
        self._check_open()
        if not self._started:
            self._started = True
            self._routes.start()
        return self

    async def close(self) -> None:
        """Send what is queued, wait (bounded) for requests in flight, release connections."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._coalescer.drain(self._close_timeout_s)
        finally:
            await self._routes.close()
            await self._http.aclose()

    async def __aenter__(self) -> Producer:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- sending -----------------------------------------------------------------------------

    async def send(
        self,
        message: Message | Body,
        *,
        topic: str | None = None,
        tag: str | None = None,
        keys: Sequence[str] | str | None = None,
        properties: Mapping[str, str] | None = None,
        sharding_key: str | None = None,
        queue_id: int | None = None,
        delay_level: int | None = None,
        delay_ms: int | None = None,
        deliver_at_ms: int | None = None,
        message_id: str | None = None,
    ) -> SendResult:
        """Send one message and wait for the broker's acknowledgement.

        ``message`` is a ``Message`` or a body; keyword arguments override its fields.
        """
        future = await self._enqueue(message, dict(
            topic=topic, tag=tag, keys=keys, properties=properties, sharding_key=sharding_key,
            queue_id=queue_id, delay_level=delay_level, delay_ms=delay_ms,
            deliver_at_ms=deliver_at_ms, message_id=message_id))
        return await future

    async def send_oneway(
        self,
        message: Message | Body,
        *,
        topic: str | None = None,
        tag: str | None = None,
        keys: Sequence[str] | str | None = None,
        properties: Mapping[str, str] | None = None,
        sharding_key: str | None = None,
        queue_id: int | None = None,
        delay_level: int | None = None,
        delay_ms: int | None = None,
        deliver_at_ms: int | None = None,
        message_id: str | None = None,
    ) -> None:
        """Queue one message without waiting for the broker; a failure is only logged.

        Invalid arguments still raise here. ``close()`` waits for queued oneway messages.
        """
        future = await self._enqueue(message, dict(
            topic=topic, tag=tag, keys=keys, properties=properties, sharding_key=sharding_key,
            queue_id=queue_id, delay_level=delay_level, delay_ms=delay_ms,
            deliver_at_ms=deliver_at_ms, message_id=message_id))
        future.add_done_callback(_log_oneway_failure)

    async def send_batch(self, topic: str, messages: Iterable[Message | Body]) -> list[SendResult]:
        """Send ``messages`` to ``topic`` in one request; results are in request order.

        The batch goes to one broker: the broker of its keyed (``sharding_key``/``queue_id``)
        messages, else the next one in round robin; other messages are spread over that
        broker's queues. Keys that map to queues of different brokers are refused — send
        those with ``send``, which coalesces per broker anyway.
        """
        self._check_open()
        self._valid_topic(topic)
        outs = [to_outgoing(self._as_message(m, {"topic": topic})) for m in messages]
        if not outs:
            return []
        limits = DEFAULT_LIMITS
        total = sum(wire_size(m) for m in outs)
        if len(outs) > limits.max_batch_messages or total > limits.max_batch_bytes:
            raise server_error(ErrorCode.MESSAGE_TOO_LARGE, f"batch of {len(outs)} messages, "
                               f"{total} bytes exceeds {limits.max_batch_messages} messages or "
                               f"{limits.max_batch_bytes} bytes; split it")
        await self.start()
        route = await self._routes.get(topic)
        pinned = {
            i: self._selector.select(route, sharding_key=m.sharding_key, queue_id=m.queue_id)
            for i, m in enumerate(outs)
            if m.sharding_key is not None or m.queue_id is not None
        }
        brokers = {q.address for q in pinned.values()}
        if len(brokers) > 1:
            raise ConfigurationError(f"send_batch: the sharding keys / queue ids of this batch "
                                     f"map to {len(brokers)} brokers; use send() instead")
        broker = brokers.pop() if brokers else self._selector.next_broker(route)
        for i, m in enumerate(outs):
            queue = pinned.get(i) or self._selector.select(route, broker=broker)
            m.queue_id = queue.queue_id
        results = await self._post(broker, topic, outs)
        if len(results) != len(outs):
            raise UnexpectedResponseError(
                f"sent {len(outs)} messages to {topic!r}, got {len(results)} results")
        return results

    # -- internals ---------------------------------------------------------------------------

    async def _enqueue(
        self, message: Message | Body, overrides: dict[str, Any],
    ) -> asyncio.Future[SendResult]:
        self._check_open()
        msg = self._as_message(message, overrides)
        if not msg.topic:
            raise ConfigurationError("send: no topic (pass topic=... or Message(topic=...))")
        self._valid_topic(msg.topic)
        out = to_outgoing(msg)
        if not self._started:
            await self.start()
        route = await self._routes.get(msg.topic)
        queue = self._selector.select(route, sharding_key=out.sharding_key, queue_id=out.queue_id)
        out.queue_id = queue.queue_id
        self._check_open()
        return self._coalescer.submit(queue.address, msg.topic, out)

    @staticmethod
    def _as_message(message: Message | Body, overrides: dict[str, Any]) -> Message:
        given = {k: v for k, v in overrides.items() if v is not None}
        if isinstance(message, Message):
            return dataclasses.replace(message, **given) if given else message
        if isinstance(message, bytes | bytearray | memoryview | str):
            return Message(body=message if isinstance(message, str) else bytes(message), **given)
        raise ConfigurationError(f"send: expected a Message, bytes or str, got "
                                 f"{type(message).__name__}")

    def _valid_topic(self, topic: str) -> None:
        if topic in self._valid_topics:
            return
        try:
            validate_topic_name(topic)
        except ProtocolError as exc:
            raise server_error(exc.code, exc.message) from None
        self._valid_topics.add(topic)

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("the producer is closed")

    async def _post(
        self, broker: str, topic: str, messages: list[OutgoingMessage],
    ) -> list[SendResult]:
        """``POST /v1/topics/{topic}/messages`` in msgpack; one result per message, in order."""
        body = {"messages": [m.to_wire(binary=True) for m in messages]}
        try:
            answer = await self._http.call("POST", url(broker, "v1", "topics", topic, "messages"),
                                           body=body, binary=True)
        except (TopicNotFoundError, TransportError):
            self._routes.invalidate(topic)  # the topic moved, or the broker is gone
            raise
        try:
            return [_send_result(r, topic) for r in answer["results"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise UnexpectedResponseError(f"malformed send answer from {broker}: {exc!r}") from exc


def _send_result(r: dict[str, Any], topic: str) -> SendResult:
    """One result of a send answer (docs/api.md); a delayed message's has no queue offset."""
    offset = r["queue_offset"]
    due = r.get("deliver_at_ms")
    return SendResult(str(r["message_id"]), topic, int(r["queue_id"]),
                      None if offset is None else int(offset), str(r.get("state") or "stored"),
                      None if due is None else int(due))


def _log_oneway_failure(future: asyncio.Future[SendResult]) -> None:
    if future.cancelled():
        return
    exc = future.exception()
    if exc is not None:
        log.warning("oneway send failed: %s", exc)
