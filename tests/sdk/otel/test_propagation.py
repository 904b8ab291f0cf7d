"""``tidemq.otel._propagation``: its own W3C formatter and parser write and read exactly what the
global propagator does, and every case they do not cover (baggage, a tracestate, another
propagator, an unusual header) goes through that propagator (no system needed)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import baggage, context, propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.propagators.textmap import (
    CarrierT,
    Getter,
    Setter,
    TextMapPropagator,
    default_getter,
    default_setter,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.trace import SpanContext, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from tidemq.otel import _propagation as P

TRACE_ID, SPAN_ID = 0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331


def span(flags: int = 1, state: TraceState | None = None) -> trace.Span:
    return trace.NonRecordingSpan(SpanContext(TRACE_ID, SPAN_ID, is_remote=False,
                                              trace_flags=TraceFlags(flags), trace_state=state))


def by_propagator(s: trace.Span) -> dict[str, str]:
    carrier: dict[str, str] = {}
    propagate.inject(carrier, trace.set_span_in_context(s))
    return carrier


class Marker(TextMapPropagator):
    """Another propagator: writes a field of its own, reads nothing."""

    def inject(self, carrier: CarrierT, context: Context | None = None,
               setter: Setter[CarrierT] = default_setter) -> None:
        setter.set(carrier, "x-marker", "1")

    def extract(self, carrier: CarrierT, context: Context | None = None,
                getter: Getter[CarrierT] = default_getter) -> Context:
        return context if context is not None else Context()

    @property
    def fields(self) -> set[str]:
        return {"x-marker"}


@pytest.fixture
def marker_propagator() -> Iterator[None]:
    default = propagate.get_global_textmap()
    propagate.set_global_textmap(CompositePropagator([TraceContextTextMapPropagator(), Marker()]))
    try:
        yield
    finally:
        propagate.set_global_textmap(default)


@pytest.mark.parametrize("flags", [0, 1, 3])
def test_inject_writes_what_the_default_propagator_writes(flags: int) -> None:
    assert P.w3c()
    carrier: dict[str, str] = {}
    P.inject(carrier, span(flags))
    assert carrier == by_propagator(span(flags))
    assert carrier == {"traceparent": f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-{flags:02x}"}


def test_inject_with_a_tracestate_or_baggage_writes_them_too() -> None:
    state = TraceState([("vendor", "abc")])
    carrier: dict[str, str] = {}
    P.inject(carrier, span(state=state))
    assert carrier == by_propagator(span(state=state))
    assert carrier["tracestate"] == "vendor=abc"
    token = context.attach(baggage.set_baggage("tenant", "t-7"))
    try:
        carrier = {}
        P.inject(carrier, span())
        assert carrier == by_propagator(span()) and carrier["baggage"] == "tenant=t-7"
    finally:
        context.detach(token)


def test_an_invalid_span_context_is_not_written() -> None:
    carrier: dict[str, str] = {}
    P.inject(carrier, trace.INVALID_SPAN)
    assert carrier == {} == by_propagator(trace.INVALID_SPAN)


@pytest.mark.parametrize("properties", [
    {"traceparent": f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01"},
    {"traceparent": f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-00", "other": "x"},
    {"traceparent": f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01", "tracestate": "vendor=abc"},
    {"traceparent": f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01", "baggage": "tenant=t-7"},
    {"traceparent": f" 00-{TRACE_ID:032x}-{SPAN_ID:016x}-01"},  # leading blank: propagator
    {"traceparent": f"01-{TRACE_ID:032x}-{SPAN_ID:016x}-01-future"},  # a later version
])
def test_extract_reads_what_the_default_propagator_reads(properties: dict[str, str]) -> None:
    parent, span_context = P.extract(properties)
    expected = propagate.extract(properties)
    assert span_context == trace.get_current_span(expected).get_span_context()
    assert span_context is not None and span_context.is_remote
    assert parent is not None
    assert trace.get_current_span(parent).get_span_context() == span_context
    assert baggage.get_all(parent) == baggage.get_all(expected)
    tracer = TracerProvider().get_tracer("test")
    child = tracer.start_span("child", context=parent)  # the default sampler: parent based
    assert child.get_span_context().trace_id == TRACE_ID
    assert child.is_recording() == span_context.trace_flags.sampled
    if child.is_recording():
        assert isinstance(child, ReadableSpan)
        assert child.parent is not None and child.parent.span_id == SPAN_ID


@pytest.mark.parametrize("properties", [
    {}, {"other": "x"}, {"traceparent": ""}, {"traceparent": "garbage"},
    {"traceparent": f"00-{0:032x}-{SPAN_ID:016x}-01"},
    {"traceparent": f"00-{TRACE_ID:032x}-{0:016x}-01"},
    {"traceparent": f"00-{TRACE_ID:032X}-{SPAN_ID:016x}-01"},  # upper case: not W3C
    {"traceparent": f"ff-{TRACE_ID:032x}-{SPAN_ID:016x}-01"},
])
def test_no_valid_context_reads_as_none(properties: dict[str, str]) -> None:
    assert P.extract(properties) == (None, None)
    assert not trace.get_current_span(propagate.extract(properties)).get_span_context().is_valid
    assert P.creation_context(properties) == (None, [])


def test_another_global_propagator_is_used_as_it_is(marker_propagator: None) -> None:
    assert not P.w3c()
    carrier: dict[str, str] = {}
    P.inject(carrier, span())
    assert carrier["x-marker"] == "1" and carrier["traceparent"].startswith("00-")
    _, span_context = P.extract(carrier)
    assert span_context is not None and span_context.span_id == SPAN_ID


def test_a_context_the_caller_put_there_is_kept_and_returned_to_link() -> None:
    mine = {"traceparent": f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01"}
    other = trace.NonRecordingSpan(SpanContext(1, 2, is_remote=False))
    carrier = dict(mine)
    origin = P.carry(carrier, other)
    assert carrier == mine
    assert origin is not None and (origin.trace_id, origin.span_id) == (TRACE_ID, SPAN_ID)
    carrier = {}
    assert P.carry(carrier, other) is None
    assert carrier == by_propagator(other)
