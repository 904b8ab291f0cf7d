"""Spans around the SDK's internal steps (``tidemq._hooks``).

A message carries its creation context in its properties (W3C ``traceparent``, and
``tracestate`` / baggage when the global propagator adds them), so it survives every re-put
inside tidemq: a half message's commit (by the producer, or after a check-back), a delay of
any length, a retry. ``tidemq.otel._propagation`` writes and reads it.

The "process" span of a message uses that context as its **parent** (one trace from the send
to the handler) and also **links** to it, as the conventions ask; a span that was current
where the handler runs (e.g. the consumer was started inside a span) is linked too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from opentelemetry import context, trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from tidemq.otel import _attributes as A
from tidemq.otel._propagation import creation_context, extract
from tidemq.protocol import ReceivedMessage

RETRY_LATER = "retry_later"  # ConsumeResult.RETRY_LATER, without importing the puller


def failed(span: trace.Span, exc: BaseException) -> None:
    """Record ``exc`` on ``span`` as the conventions ask (status, ``error.type``)."""
    if not span.is_recording():
        return
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
    span.set_attribute(A.ERROR_TYPE, type(exc).__qualname__)


class OtelTracer:
    """``tidemq._hooks.Tracer`` with OpenTelemetry spans."""

    def __init__(self, tracer: trace.Tracer, shapes: A.Shapes) -> None:
        self.tracer = tracer
        self.shapes = shapes

    async def process(self, handler: Callable[[ReceivedMessage], Awaitable[Any]],
                      message: ReceivedMessage, group: str, clustering: bool) -> Any:
        # runs per message: start_span + attach rather than start_as_current_span (its two
        # generator-based context managers), the name and creation attributes shared by the
        # queue's messages, the message's own attributes only on a span the sampler records
        parent, origin = extract(message.properties)
        links: list[Link] = []
        if origin is not None:
            links.append(Link(origin))
            ambient = trace.get_current_span().get_span_context()
            if ambient.is_valid:
                links.append(Link(ambient))
        name, attrs = self.shapes.process(message.topic, message.queue_id, group, clustering)
        span = self.tracer.start_span(name, context=parent, kind=SpanKind.CONSUMER,
                                      attributes=attrs, links=links)
        if span.is_recording():
            span.set_attributes(A.about(message))
        token = context.attach(trace.set_span_in_context(span))
        try:
            result = await handler(message)
            if result == RETRY_LATER:
                span.set_attribute(A.ERROR_TYPE, RETRY_LATER)
                span.set_status(Status(StatusCode.ERROR, "the handler asked to retry later"))
            return result
        except Exception as exc:
            failed(span, exc)
            raise
        except asyncio.CancelledError:  # timed out, or its queue was revoked
            span.set_attribute(A.ERROR_TYPE, "cancelled")
            span.set_status(Status(StatusCode.ERROR, "the handler was cancelled (it timed out, "
                                   "or its queue went to another consumer)"))
            raise
        finally:
            context.detach(token)
            span.end()

    async def check(self, check: Callable[[ReceivedMessage], Awaitable[Any]],
                    message: ReceivedMessage, group: str) -> Any:
        parent, links = creation_context(message.properties)
        attrs = A.received(message, "check", "process")
        attrs[A.PRODUCER_GROUP] = group
        with self.tracer.start_as_current_span(
                f"check {message.topic}", context=parent, kind=SpanKind.CONSUMER,
                attributes=attrs, links=links) as span:
            try:
                answer = await check(message)
            except Exception as exc:
                span.set_attribute(A.ERROR_TYPE, type(exc).__qualname__)
                raise
            span.set_attribute(A.CHECK_ANSWER, str(getattr(answer, "value", answer)))
            return answer

    async def settle(self, call: Awaitable[str], message: ReceivedMessage, group: str,
                     action: str) -> str:
        attrs = A.received(message, "settle", "settle")
        attrs[A.CONSUMER_GROUP] = group
        attrs[A.SETTLE_ACTION] = action
        with self.tracer.start_as_current_span(
                f"settle {message.topic}", kind=SpanKind.CLIENT, attributes=attrs,
                links=creation_context(message.properties)[1]) as span:
            destination = await call
            if destination:
                span.set_attribute(A.SETTLE_DESTINATION, destination)
            return destination
