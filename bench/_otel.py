"""``--otel`` of bench/produce_consume.py: tidemq's produce and consume with tracing off and on.

Tracing on = ``TidemqInstrumentor().instrument()`` with an OpenTelemetry SDK tracer provider,
a ``BatchSpanProcessor`` (the usual production setup) and an exporter that counts the spans
and drops them (no network in the figure), in two configurations: every trace sampled (the
worst case) and one trace in ten (``ParentBased(TraceIdRatioBased(0.1))``: the consumer
follows the producer's decision, carried in ``traceparent``). Off is the SDK as shipped
(nothing instrumented: its methods are its own and ``tidemq._hooks.tracer`` is None).

The machine is shared, so the configurations are interleaved: each round runs every phase off,
then on in each configuration, back to back; a phase's figure is its best round (the one least
disturbed by anything else running), with that run's client CPU per message — the steadier
figure. The overhead is ``1 - on / off`` of the throughput. Consume reads what the same
configuration produced (16 in flight), so its messages carry that configuration's context.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

from bench._common import Row

ROUNDS = 2
PHASES = (("produce_await", "produce, 64 senders x await send"),
          ("produce", "produce, 64 senders x 16 in flight"),
          ("consume", "consume, PushConsumer"))
#: configuration → (sampled ratio or None for off, label)
CONFIGS: dict[str, tuple[float | None, str]] = {
    "off": (None, "tracing off"),
    "all": (1.0, "tracing on, every trace sampled"),
    "tenth": (0.1, "tracing on, 1 trace in 10 sampled"),
}


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


def _ignore(body: bytes) -> None:
    """The consume phases' handler work: none (the consumer counts the messages)."""


def _cpu_us(run: dict[str, Any]) -> float | None:
    """This (client) process's CPU per message over a run, in microseconds."""
    value = run.get("client_us_per_msg")
    return None if value is None else float(value)


async def measure(t: Any, n: int, bodies: list[bytes], senders: int, window: int,
                  rounds: int = ROUNDS) -> dict[str, Any]:
    """Every phase in every configuration, ``rounds`` times interleaved, on the running
    ``Tidemq`` of the bench; per (phase, configuration) the best run, and the spans made."""
    tracings = {k: Tracing(ratio) for k, (ratio, _) in CONFIGS.items() if ratio is not None}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {p: {k: [] for k in CONFIGS}
                                                        for p, _ in PHASES}

    def scope(config: str) -> Any:
        return tracings[config].on() if config in tracings else nullcontext()

    try:
        for r in range(rounds):
            for config in CONFIGS:
                with scope(config):
                    runs["produce_await"][config].append((await t.produce(
                        f"BenchOtel1{config}{r}", n, senders, 1, bodies)).as_dict())
            for config in CONFIGS:
                with scope(config):
                    runs["produce"][config].append((await t.produce(
                        f"BenchOtel{config}{r}", n, senders, window, bodies)).as_dict())
            for config in CONFIGS:
                with scope(config):
                    runs["consume"][config].append((await t.consume(
                        f"BenchOtel{config}{r}", n, _ignore)).as_dict())
        spans = {k: tracing.spans() for k, tracing in tracings.items()}
    finally:
        for tracing in tracings.values():
            tracing.close()
    best = {p: {k: max(rs, key=lambda x: x["msgs_per_s"]) for k, rs in by.items()}
            for p, by in runs.items()}
    return {"rounds": rounds, "messages": n, "best": best, "spans": spans}


def rows(otel: dict[str, Any]) -> list[Row]:
    """Per phase: off, and each configuration on with its ratio to off and its overhead."""
    out: list[Row] = []
    best = otel.get("best", {})
    for phase, label in PHASES:
        runs = best.get(phase, {})
        off = (runs.get("off") or {}).get("msgs_per_s")
        for config, (ratio, how) in CONFIGS.items():
            run = runs.get(config) or {}
            value, cpu = run.get("msgs_per_s"), _cpu_us(run) if run else None
            note = "" if cpu is None else f"client CPU {cpu:.0f} us/msg"
            if ratio is not None and value and off:
                note = f"overhead {100 * (1 - value / off):.0f}%; " + note
            out.append(Row(f"tidemq {label}: {how}", value, "msgs/s",
                           None if ratio is None or not (value and off) else value / off, note))
    for config, (ratio, how) in CONFIGS.items():
        if ratio is not None:
            out.append(Row(f"spans exported, {how}", otel.get("spans", {}).get(config),
                           "spans"))
    return out


def caption(otel: dict[str, Any]) -> str:
    return (f"{otel.get('messages', 0):,} messages per run; each figure is the best of "
            f"{otel.get('rounds', 0)} interleaved rounds (off, every trace, 1 in 10, back to "
            "back); client CPU: this process per message in that run; bench/_otel.py")


def summary(otel: dict[str, Any]) -> dict[str, Any]:
    """The JSON figures: per phase and configuration, msgs/s, client CPU and overhead."""
    out: dict[str, Any] = {"rounds": otel.get("rounds"), "spans": otel.get("spans")}
    for phase, _ in PHASES:
        runs = otel.get("best", {}).get(phase, {})
        off = (runs.get("off") or {}).get("msgs_per_s")
        out[phase] = {}
        for config, (ratio, _) in CONFIGS.items():
            run = runs.get(config) or {}
            value = run.get("msgs_per_s")
            out[phase][config] = {
                "sampled_ratio": ratio, "msgs_per_s": value,
                "client_cpu_us_per_msg": _cpu_us(run) if run else None,
                "overhead_pct": None if ratio is None or not (value and off)
                else 100.0 * (1 - value / off)}
    return out
