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

import functools
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry import context, trace
from opentelemetry.trace import SpanKind

from tidemq import _validate as V
from tidemq._exceptions import LocalTransactionError
from tidemq._message import Message, new_message_id
from tidemq._producer import Producer
from tidemq._send import as_message
from tidemq._simple_consumer import SimpleConsumer
from tidemq._transaction import TransactionProducer
from tidemq.otel import _attributes as A
from tidemq.otel._propagation import TRACEPARENT, carry, extract, inject, links_of
from tidemq.otel._tracer import failed
from tidemq.protocol import ReceivedMessage

_FIELDS = ("topic", "tag", "keys", "properties", "sharding_key", "delay_level", "delay_ms",
           "deliver_at_ms", "message_id")

_BARE = (bytes, str)

#: (class, method name, original function) of every method wrapped; ``unwrap`` restores them.
Patch = tuple[type, str, Callable[..., Any]]


def _fields(message: Any, options: dict[str, Any]) -> dict[str, Any]:
    """The message's fields as the send will see them: options given override the Message's."""
    base = message if isinstance(message, Message) else None
    out = {f: getattr(base, f, None) for f in _FIELDS}
    out.update({k: v for k, v in options.items() if v is not None})
    # checked as the send checks them (it would refuse them anyway), so the span's attributes
    # never trip over a wrong type, and delays given as timedelta / datetime are milliseconds
    out["delay_ms"] = V.duration_ms(out["delay_ms"])
    out["deliver_at_ms"] = V.epoch_ms(out["deliver_at_ms"])
    if out["keys"] is not None:
        out["keys"] = V.keys(out["keys"])
    if out["properties"] is not None:
        V.properties(out["properties"])
    return out


def _message_type(f: dict[str, Any], transaction: bool = False) -> str:
    delayed = bool(f["delay_level"]) or f["delay_ms"] is not None \
        or f["deliver_at_ms"] is not None
    return A.message_type(delayed=delayed, sharding_key=f["sharding_key"],
                          transaction=transaction)


def _per_message(f: dict[str, Any] | None, message_id: str) -> dict[str, Any]:
    """A send span's own attributes (only a recording span gets them)."""
    if f is None:
        return {A.MESSAGE_ID: message_id}
    return A.outgoing(message_id=message_id, tag=f["tag"], keys=f["keys"],
                      delay_level=f["delay_level"], deliver_at_ms=f["deliver_at_ms"],
                      delay_ms=f["delay_ms"], sharding_key=f["sharding_key"])


def _traced_send(tracer: trace.Tracer, shapes: A.Shapes,
                 original: Callable[..., Any]) -> Callable[..., Any]:
    # runs per message, so: the span is not made current (nothing inside a send makes spans
    # of its own, and the coalesced request goes out from another task), its name and
    # creation attributes are shared by the topic's messages, and its per-message attributes
    # are built only when the sampler records it, in one call once the send is done
    @functools.wraps(original)
    async def send(self: Producer, message: Any, **options: Any) -> Any:
        topic = options.get("topic")
        f: dict[str, Any] | None = None
        if topic and len(options) == 1 and type(message) in _BARE:  # send(body, topic=...)
            mid = new_message_id()
            name, attrs = shapes.send(topic, "normal")
            properties: dict[str, str] = {}
        else:
            f = _fields(message, options)
            if not f["topic"]:
                return await original(self, message, **options)  # fails with the SDK's error
            mid = f["message_id"] = f["message_id"] or new_message_id()
            name, attrs = shapes.send(f["topic"], _message_type(f))
            properties = dict(f["properties"] or {})
        span = tracer.start_span(name, kind=SpanKind.PRODUCER, attributes=attrs)
        try:
            origin = carry(properties, span)
            if origin is not None:
                span.add_link(origin)
            result = await original(self, message, **{**options, "properties": properties,
                                                      "message_id": mid})
            if span.is_recording():
                own = _per_message(f, mid)
                own[A.CLIENT_ID] = self.client_id
                if result is not None:  # send_oneway's is
                    own[A.PARTITION] = str(result.queue_id)
                    own.update(A.server(self._address_of(result.topic, result.broker_name)))
                span.set_attributes(own)
            return result
        except BaseException as exc:
            if span.is_recording():
                span.set_attributes(_per_message(f, mid))
                if isinstance(exc, Exception):
                    failed(span, exc)
            raise
        finally:
            span.end()
    return send


def _traced_send_batch(tracer: trace.Tracer, shapes: A.Shapes,
                       original: Callable[..., Any]) -> Callable[..., Any]:
    # one span for the batch (``messaging.batch.message_count``); its context is formatted
    # once and copied into every message that does not carry a creation context of its own
    # (the span links to those)
    @functools.wraps(original)
    async def send_batch(self: Producer, topic: str, messages: Iterable[Any]) -> Any:
        items = list(messages)
        name, shape = shapes.send(topic, "")
        span = tracer.start_span(name, kind=SpanKind.PRODUCER,
                                 attributes={**shape, A.BATCH_COUNT: len(items)})
        try:
            carried: dict[str, str] = {}
            inject(carried, span)
            outgoing = []
            for m in items:
                own = m.properties if isinstance(m, Message) else {}
                if TRACEPARENT in own:
                    origin = extract(own)[1]
                    if origin is not None:
                        span.add_link(origin)
                    outgoing.append(m)
                else:
                    outgoing.append(as_message(m, {"properties": {**own, **carried}}))
            return await original(self, topic, outgoing)
        except Exception as exc:
            failed(span, exc)
            raise
        finally:
            span.end()
    return send_batch


def _traced_transaction_send(tracer: trace.Tracer, shapes: A.Shapes,
                             original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def send(self: TransactionProducer, message: Any, arg: Any = None,
                   **options: Any) -> Any:
        f = _fields(message, options)
        if not f["topic"]:
            return await original(self, message, arg, **options)
        mid = f["message_id"] = f["message_id"] or new_message_id()
        name, attrs = shapes.send(f["topic"], _message_type(f, transaction=True))
        span = tracer.start_span(name, kind=SpanKind.PRODUCER, attributes=attrs)
        if span.is_recording():
            span.set_attributes({**_per_message(f, mid), A.PRODUCER_GROUP: self.group,
                                 A.CLIENT_ID: self.client_id})
        properties = dict(f["properties"] or {})
        origin = carry(properties, span)
        if origin is not None:
            span.add_link(origin)
        # current while the local transaction runs: its own spans nest inside
        token = context.attach(trace.set_span_in_context(span))
        try:
            result = await original(self, message, arg, **{
                **options, "properties": properties, "message_id": mid})
            _transaction_outcome(span, result, self)
            return result
        except LocalTransactionError as exc:
            _transaction_outcome(span, exc.result)
            failed(span, exc)
            raise
        except Exception as exc:
            failed(span, exc)
            raise
        finally:
            context.detach(token)
            span.end()
    return send


def _transaction_outcome(span: trace.Span, result: Any, producer: TransactionProducer | None = None
                         ) -> None:
    span.set_attributes({A.TRANSACTION_ID: result.transaction_id,
                         A.LOCAL_STATE: str(result.local_state.value)})
    if producer is not None and span.is_recording():
        span.set_attributes(A.server(producer._address_of(result.topic, result.broker_name)))


def _traced_receive(tracer: trace.Tracer, shapes: A.Shapes,
                    original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def receive(self: SimpleConsumer, *args: Any, **kwargs: Any) -> Any:
        attrs = A.operation("receive", "receive")
        attrs[A.DESTINATION] = self.topic
        attrs[A.CONSUMER_GROUP] = self.group
        with tracer.start_as_current_span(f"receive {self.topic}", kind=SpanKind.CLIENT,
                                          attributes=attrs) as span:
            messages: list[ReceivedMessage] = await original(self, *args, **kwargs)
            if span.is_recording():
                span.set_attribute(A.BATCH_COUNT, len(messages))
                for link in links_of(messages):
                    span.add_link(link.context)
            return messages
    return receive


def _traced_ack(tracer: trace.Tracer, shapes: A.Shapes,
                original: Callable[..., Any]) -> Callable[..., Any]:
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


def wrap(tracer: trace.Tracer, shapes: A.Shapes) -> list[Patch]:
    """Install every wrapper; what ``unwrap`` needs to take them out again."""
    patches: list[Patch] = []
    for owner, name, make in _WRAPPERS:
        original = owner.__dict__[name]
        setattr(owner, name, make(tracer, shapes, original))
        patches.append((owner, name, original))
    return patches


def unwrap(patches: list[Patch]) -> None:
    for owner, name, original in reversed(patches):
        setattr(owner, name, original)
