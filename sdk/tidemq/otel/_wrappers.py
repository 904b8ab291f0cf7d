"""Wrappers of the SDK's public methods, installed while instrumented (and only then).

- ``Producer.send`` / ``send_oneway``: a "send {topic}" span (PRODUCER); the message gets its
  id before the span starts and carries the span's context in its properties.
- ``Producer.send_batch``: one "send {topic}" span for the batch; every message carries it.
- ``TransactionProducer.send``: a "send {topic}" span (PRODUCER, type ``transaction``) around
  the half message, the local transaction (its own spans nest inside) and the end.
- ``SimpleConsumer.receive``: a "receive {topic}" span (CLIENT) linking every message's
  creation context; ``SimpleConsumer.ack``: a "settle {topic}" span (CLIENT).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from tidemq._exceptions import LocalTransactionError
from tidemq._message import Message, new_message_id
from tidemq._producer import Producer
from tidemq._simple_consumer import SimpleConsumer
from tidemq._transaction import TransactionProducer
from tidemq.otel import _attributes as A
from tidemq.otel._tracer import failed, inject, links_of
from tidemq.protocol import ReceivedMessage

_FIELDS = ("topic", "tag", "keys", "properties", "sharding_key", "delay_level", "delay_ms",
           "deliver_at_ms", "message_id")

_BARE = (bytes, str)
_NORMAL_SEND = {**A.operation("send", "send"), A.MESSAGE_TYPE: "normal"}

#: (class, method name, original function) of every method wrapped; ``unwrap`` restores them.
Patch = tuple[type, str, Callable[..., Any]]


def _fields(message: Any, options: dict[str, Any]) -> dict[str, Any]:
    """The message's fields as the send will see them: options given override the Message's."""
    base = message if isinstance(message, Message) else None
    out = {f: getattr(base, f, None) for f in _FIELDS}
    out.update({k: v for k, v in options.items() if v is not None})
    return out


def _send_attributes(f: dict[str, Any], transaction: bool = False) -> dict[str, Any]:
    delayed = bool(f["delay_level"]) or f["delay_ms"] is not None \
        or f["deliver_at_ms"] is not None
    kind = A.message_type(delayed=delayed, sharding_key=f["sharding_key"],
                          transaction=transaction)
    return A.outgoing(f["topic"], message_type=kind, message_id=f["message_id"], tag=f["tag"],
                      keys=f["keys"], delay_level=f["delay_level"],
                      deliver_at_ms=f["deliver_at_ms"], delay_ms=f["delay_ms"],
                      sharding_key=f["sharding_key"], now_ms=time.time_ns() // 1_000_000)


def _traced_send(tracer: trace.Tracer, original: Callable[..., Any]) -> Callable[..., Any]:
    # the span is not made current: nothing inside a send makes spans of its own, and
    # attaching it to the context would cost more than the rest of the wrapper
    @functools.wraps(original)
    async def send(self: Producer, message: Any, **options: Any) -> Any:
        topic = options.get("topic")
        if topic and len(options) == 1 and type(message) in _BARE:  # send(body, topic=...)
            mid = new_message_id()
            attrs = {**_NORMAL_SEND, A.DESTINATION: topic, A.MESSAGE_ID: mid}
            properties: dict[str, str] = {}
        else:
            f = _fields(message, options)
            if not f["topic"]:
                return await original(self, message, **options)  # fails with the SDK's error
            topic = f["topic"]
            mid = f["message_id"] = f["message_id"] or new_message_id()
            attrs = _send_attributes(f)
            properties = dict(f["properties"] or {})
        span = tracer.start_span(f"send {topic}", kind=SpanKind.PRODUCER, attributes=attrs)
        try:
            for link in inject(properties, trace.set_span_in_context(span)):
                span.add_link(link.context)
            result = await original(self, message, **{**options, "properties": properties,
                                                      "message_id": mid})
            if result is not None:
                span.set_attribute(A.PARTITION, str(result.queue_id))
            return result
        except Exception as exc:
            failed(span, exc)
            raise
        finally:
            span.end()
    return send


def _traced_send_batch(tracer: trace.Tracer, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def send_batch(self: Producer, topic: str, messages: Iterable[Any]) -> Any:
        items = list(messages)
        attrs = A.operation("send", "send")
        attrs[A.DESTINATION] = topic
        attrs[A.BATCH_COUNT] = len(items)
        with tracer.start_as_current_span(f"send {topic}", kind=SpanKind.PRODUCER,
                                          attributes=attrs):
            carried = []
            for m in items:
                message = m if isinstance(m, Message) else Message(body=m)
                properties = dict(message.properties)
                inject(properties)
                carried.append(dataclasses.replace(message, properties=properties))
            return await original(self, topic, carried)
    return send_batch


def _traced_transaction_send(tracer: trace.Tracer, original: Callable[..., Any]
                             ) -> Callable[..., Any]:
    @functools.wraps(original)
    async def send(self: TransactionProducer, message: Any, arg: Any = None,
                   **options: Any) -> Any:
        f = _fields(message, options)
        if not f["topic"]:
            return await original(self, message, arg, **options)
        f["message_id"] = f["message_id"] or new_message_id()
        attrs = _send_attributes(f, transaction=True)
        attrs[A.PRODUCER_GROUP] = self.group
        with tracer.start_as_current_span(f"send {f['topic']}", kind=SpanKind.PRODUCER,
                                          attributes=attrs) as span:
            properties = dict(f["properties"] or {})
            for link in inject(properties):
                span.add_link(link.context)
            try:
                result = await original(self, message, arg, **{
                    **options, "properties": properties, "message_id": f["message_id"]})
            except LocalTransactionError as exc:
                _transaction_outcome(span, exc.result)
                raise
            _transaction_outcome(span, result)
            return result
    return send


def _transaction_outcome(span: trace.Span, result: Any) -> None:
    span.set_attribute(A.TRANSACTION_ID, result.transaction_id)
    span.set_attribute(A.LOCAL_STATE, str(result.local_state.value))


def _traced_receive(tracer: trace.Tracer, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def receive(self: SimpleConsumer, *args: Any, **kwargs: Any) -> Any:
        attrs = A.operation("receive", "receive")
        attrs[A.DESTINATION] = self.topic
        attrs[A.CONSUMER_GROUP] = self.group
        with tracer.start_as_current_span(f"receive {self.topic}", kind=SpanKind.CLIENT,
                                          attributes=attrs) as span:
            messages: list[ReceivedMessage] = await original(self, *args, **kwargs)
            span.set_attribute(A.BATCH_COUNT, len(messages))
            for link in links_of(messages):
                span.add_link(link.context)
            return messages
    return receive


def _traced_ack(tracer: trace.Tracer, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def ack(self: SimpleConsumer, messages: Any) -> Any:
        items = [messages] if isinstance(messages, ReceivedMessage | str) else list(messages)
        received = [m for m in items if isinstance(m, ReceivedMessage)]
        attrs = A.operation("settle", "settle")
        attrs[A.DESTINATION] = self.topic
        attrs[A.CONSUMER_GROUP] = self.group
        attrs[A.SETTLE_ACTION] = "ack"
        if len(items) == 1 and received:
            attrs[A.MESSAGE_ID] = received[0].message_id
        else:
            attrs[A.BATCH_COUNT] = len(items)
        with tracer.start_as_current_span(f"settle {self.topic}", kind=SpanKind.CLIENT,
                                          attributes=attrs, links=links_of(received)):
            return await original(self, items)
    return ack


_WRAPPERS: tuple[tuple[type, str, Callable[..., Any]], ...] = (
    (Producer, "send", _traced_send),
    (Producer, "send_oneway", _traced_send),
    (Producer, "send_batch", _traced_send_batch),
    (TransactionProducer, "send", _traced_transaction_send),
    (SimpleConsumer, "receive", _traced_receive),
    (SimpleConsumer, "ack", _traced_ack),
)


def wrap(tracer: trace.Tracer) -> list[Patch]:
    """Install every wrapper; what ``unwrap`` needs to take them out again."""
    patches: list[Patch] = []
    for owner, name, make in _WRAPPERS:
        original = owner.__dict__[name]
        setattr(owner, name, make(tracer, original))
        patches.append((owner, name, original))
    return patches


def unwrap(patches: list[Patch]) -> None:
    for owner, name, original in reversed(patches):
        setattr(owner, name, original)
