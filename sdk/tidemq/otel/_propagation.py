"""A message's creation context in its properties (W3C ``traceparent``), at a per-message cost.

The global propagator goes through a chain of calls per message (composite → trace context
→ baggage, a ``Context`` built to carry the span) that cost more than tidemq's own work on
the message. When the global propagator is OpenTelemetry's default, W3C trace context (with
W3C baggage or without), and there is nothing but a ``traceparent`` to carry, the header is
written and read here directly, to the same text the propagator writes and with the same
result it reads. Anything else — another propagator, baggage in the context or the message,
a ``tracestate``, a header not of the common form (version 00, lower-case hex) — goes through
the global propagator, as before.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping

from opentelemetry import baggage, context, propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace.span import DEFAULT_TRACE_STATE

from tidemq.protocol import ReceivedMessage

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
BAGGAGE = "baggage"

#: the traceparent every OpenTelemetry SDK writes: version 00, lower-case hex, nothing after
_COMMON_FORM = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_EMPTY = Context()
_W3C = (TraceContextTextMapPropagator, W3CBaggagePropagator)

#: (the global propagator last seen, whether it is W3C only): looked at once per propagator
_seen: tuple[object, bool] = (None, False)


def _w3c_only(propagator: object) -> bool:
    """True for W3C trace context alone or with W3C baggage (the default ``tracecontext,
    baggage`` of ``OTEL_PROPAGATORS``)."""
    if type(propagator) is TraceContextTextMapPropagator:
        return True
    if type(propagator) is not CompositePropagator:
        return False
    kinds = [type(p) for p in getattr(propagator, "_propagators", ())]  # no public accessor
    return TraceContextTextMapPropagator in kinds and all(k in _W3C for k in kinds)


def w3c() -> bool:
    """Whether the global propagator is W3C only (it may be replaced at any time)."""
    global _seen
    propagator = propagate.get_global_textmap()
    seen = _seen
    if seen[0] is not propagator:
        seen = _seen = (propagator, _w3c_only(propagator))
    return seen[1]


def traceparent(span_context: SpanContext) -> str:
    return (f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-"
            f"{span_context.trace_flags:02x}")


def inject(properties: MutableMapping[str, str], span: trace.Span) -> None:
    """Write ``span``'s context (and the current baggage) into ``properties``."""
    current = context.get_current()
    if w3c() and not (current and baggage.get_all(current)):
        span_context = span.get_span_context()
        if span_context.is_valid:
            properties[TRACEPARENT] = traceparent(span_context)
            state = span_context.trace_state
            if state is not DEFAULT_TRACE_STATE and state:
                properties[TRACESTATE] = state.to_header()
        return
    propagate.inject(properties, trace.set_span_in_context(span))


def extract(properties: Mapping[str, str]) -> tuple[Context | None, SpanContext | None]:
    """The creation context ``properties`` carry, and its span context; (None, None) when
    they carry none that is valid."""
    if not properties:
        return None, None
    if w3c() and TRACESTATE not in properties and BAGGAGE not in properties:
        header = properties.get(TRACEPARENT)
        if header is None:
            return None, None
        match = _COMMON_FORM.fullmatch(header)
        if match is not None:
            trace_id, span_id = int(match[1], 16), int(match[2], 16)
            if not (trace_id and span_id):
                return None, None
            span_context = SpanContext(trace_id, span_id, is_remote=True,
                                       trace_flags=TraceFlags(int(match[3], 16)))
            return trace.set_span_in_context(NonRecordingSpan(span_context), _EMPTY), \
                span_context
    found = propagate.extract(properties)
    span_context = trace.get_current_span(found).get_span_context()
    if not span_context.is_valid:
        return None, None
    return found, span_context


def creation_context(properties: Mapping[str, str]) -> tuple[Context | None, list[Link]]:
    """The message's creation context (None when it carries none) and a link to it."""
    found, span_context = extract(properties)
    return found, [] if span_context is None else [Link(span_context)]


def links_of(messages: list[ReceivedMessage]) -> list[Link]:
    """A link to each message's creation context (those that carry one)."""
    found = (extract(m.properties)[1] for m in messages)
    return [Link(span_context) for span_context in found if span_context is not None]


def carry(properties: MutableMapping[str, str], span: trace.Span) -> SpanContext | None:
    """Write ``span``'s context into the properties of a message to send, unless the caller put
    a creation context there already (the conventions' "custom creation context": it is kept,
    and its span context returned, for the send span to link to it)."""
    if TRACEPARENT in properties:
        return extract(properties)[1]
    inject(properties, span)
    return None
