"""``--otel`` of bench/produce_consume.py: the tidemq rows again with tracing on, in the same run.

Tracing on = ``TidemqInstrumentor().instrument()`` with an OpenTelemetry SDK tracer provider,
a ``BatchSpanProcessor`` (the usual production setup) and an exporter that counts the spans
and drops them (no network in the figure), in two configurations: every trace sampled (the
worst case) and one trace in ten (``ParentBased(TraceIdRatioBased(0.1))``: the consumer
follows the producer's decision, carried in ``traceparent``). Each phase runs with tracing off
and then on right after it, so they see the same machine; off is the SDK as shipped (nothing
instrumented: its methods are its own and ``tidemq._hooks.tracer`` is None). The overhead is
``1 - on / off`` of the throughput.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from bench._common import Row

PHASES = (("produce_await", "produce, 64 senders x await send"),
          ("produce", "produce, 64 senders x 16 in flight"),
          ("consume", "consume, PushConsumer"))
#: result key suffix → (sampled ratio, label)
CONFIGS = {"otel": (1.0, "every trace sampled"), "otel10": (0.1, "1 trace in 10 sampled")}


class Tracing:
    """A tracer provider whose exporter counts spans; ``on()`` instruments tidemq with it."""

    def __init__(self, ratio: float) -> None:
        from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        class Counting(SpanExporter):
            def __init__(self) -> None:
                self.spans = 0

            def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
                self.spans += len(spans)
                return SpanExportResult.SUCCESS

        self.exporter = Counting()
        self.provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
        self.provider.add_span_processor(BatchSpanProcessor(self.exporter))

    @contextmanager
    def on(self) -> Iterator[None]:
        from tidemq.otel import TidemqInstrumentor

        TidemqInstrumentor().instrument(tracer_provider=self.provider)
        try:
            yield
        finally:
            TidemqInstrumentor().uninstrument()

    def spans(self) -> int:
        self.provider.force_flush()
        return int(self.exporter.spans)

    def close(self) -> None:
        self.provider.shutdown()


def _cpu_us(phase: dict[str, Any] | None) -> float | None:
    """This (client) process's CPU per message over a phase, in microseconds."""
    if not phase or not phase.get("msgs"):
        return None
    return 1e6 * phase["client_cpu_util"] * phase["seconds"] / phase["msgs"]


def rows(tidemq: dict[str, Any]) -> list[Row]:
    """Per phase: off, each configuration on with its overhead (``1 - on/off``), and the client
    CPU per message (steadier than throughput on a loaded machine)."""
    out: list[Row] = []
    for key, label in PHASES:
        off_phase = tidemq.get(key)
        off = (off_phase or {}).get("msgs_per_s")
        cpu = _cpu_us(off_phase)
        out.append(Row(f"tidemq {label}: tracing off", off, "msgs/s", None,
                       "" if cpu is None else f"client CPU {cpu:.0f} us/msg"))
        for suffix, (_, how) in CONFIGS.items():
            on_phase = tidemq.get(f"{key}_{suffix}")
            on = (on_phase or {}).get("msgs_per_s")
            cpu = _cpu_us(on_phase)
            note = "" if not (on and off) else f"overhead {100 * (1 - on / off):.0f}%"
            if cpu is not None:
                note += f"; client CPU {cpu:.0f} us/msg"
            out.append(Row(f"tidemq {label}: tracing on, {how}", on, "msgs/s",
                           None if not (on and off) else on / off, note))
    for suffix, (_, how) in CONFIGS.items():
        out.append(Row(f"spans exported, {how}", tidemq.get(f"{suffix}_spans"), "spans"))
    return out


def summary(tidemq: dict[str, Any]) -> dict[str, Any]:
    """The JSON figures: off, and on / overhead per configuration, per phase."""
    out: dict[str, Any] = {}
    for key, _ in PHASES:
        off = (tidemq.get(key) or {}).get("msgs_per_s")
        phase: dict[str, Any] = {"off_msgs_per_s": off,
                                 "off_client_cpu_us_per_msg": _cpu_us(tidemq.get(key))}
        for suffix, (ratio, _) in CONFIGS.items():
            on = (tidemq.get(f"{key}_{suffix}") or {}).get("msgs_per_s")
            phase[suffix] = {"sampled_ratio": ratio, "on_msgs_per_s": on,
                             "client_cpu_us_per_msg": _cpu_us(tidemq.get(f"{key}_{suffix}")),
                             "overhead_pct": None if not (on and off)
                             else 100.0 * (1 - on / off)}
        out[key] = phase
    for suffix in CONFIGS:
        out[f"{suffix}_spans"] = tidemq.get(f"{suffix}_spans")
    return out
