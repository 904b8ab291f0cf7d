"""The scheduler's Prometheus metrics (``tidemq_scheduler_*``), on a registry of its own.

Delivery lateness (delivered - due, by the scheduler's clock, at the broker's acknowledgement)
is a histogram; counts that already live in the service (pending timers, near-window size,
disk bytes, progress) are read at scrape time through a collector.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from tidemq_server.common.stats import Stat, StatsCollector

log = logging.getLogger(__name__)

LATENESS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


#: ``DelayService.gauges()`` (``tidemq_scheduler_*``)
SCHEDULER_STATS: dict[str, Stat] = {
    "pending_timers": Stat("Arbitrary-delay timers waiting in the timer store"),
    "pending_level_messages": Stat("Delay-level messages waiting in the level queues"),
    "near_timers": Stat("Timers in the in-memory near window"),
    "queued_timers": Stat("Due timers queued for delivery"),
    "in_flight_timers": Stat("Timers being delivered to the broker"),
    "loaded_buckets": Stat("Timer-log buckets loaded in memory"),
    "buckets": Stat("Timer-log buckets on disk"),
    "disk_bytes": Stat("Bytes of the timer store on disk"),
    "ingested_offset": Stat("Next offset of the broker's timer intake topic to take in"),
    "rebuild_floor": Stat("Intake offset below which a rebuild needs nothing (the retention "
                          "floor the scheduler reports)"),
    "rebuilding": Stat("1 while the timer store is being rebuilt from the intake topic"),
    "intake_lag": Stat("Timers in the intake topic not yet taken in"),
    "max_lateness_ms": Stat("Largest delivery lateness seen since the start (seconds)",
                            name="max_lateness_seconds", scale=0.001),
    "clock_offset_ms": Stat("Offset of the scheduler's clock from the host clock, e.g. under a "
                            "test clock (seconds)", name="clock_offset_seconds", scale=0.001),
    "resident_bytes": Stat("Resident memory of the scheduler process (bytes)"),
}


class Lateness(Collector):
    """A histogram of delivery lateness, observed in bulk (a batch at a time, C-speed bisect)
    rather than one ``observe`` call per timer."""

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENESS_BUCKETS) + 1)
        self.total_s = 0.0
        self.max_ms = 0

    def observe_ms(self, values: list[int]) -> None:
        if not values:
            return
        edges = [b * 1000 for b in LATENESS_BUCKETS]
        counts = self.counts
        for v in values:
            counts[bisect.bisect_left(edges, v)] += 1
        self.total_s += sum(values) / 1000
        self.max_ms = max(self.max_ms, max(values))

    def collect(self) -> Iterator[Metric]:
        cumulative, buckets = 0, []
        for edge, n in zip([*map(str, LATENESS_BUCKETS), "+Inf"], self.counts, strict=True):
            cumulative += n
            buckets.append((edge, cumulative))
        yield HistogramMetricFamily("tidemq_scheduler_lateness_seconds",
                                    "Delivery time minus due time (scheduler clock), at the "
                                    "broker's acknowledgement", buckets=buckets,
                                    sum_value=self.total_s)


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.delivered_total = Counter("tidemq_scheduler_delivered",
                                       "Delayed messages delivered, by kind (timer, level)",
                                       ["kind"], registry=r)
        self.lateness = Lateness()
        r.register(self.lateness)
        self.ingested = Counter("tidemq_scheduler_ingested",
                                "Timers taken in from the broker's intake topic", registry=r)
        self.cancelled = Counter("tidemq_scheduler_cancelled",
                                 "Delayed messages cancelled, by kind (timer, level)", ["kind"],
                                 registry=r)
        self.duplicates = Counter("tidemq_scheduler_duplicates",
                                  "Re-deliveries the broker found already stored", registry=r)
        self.delivery_failures = Counter("tidemq_scheduler_delivery_failures",
                                         "Deliver requests that failed and were retried",
                                         registry=r)
        self.rolled = Counter("tidemq_scheduler_rolled",
                              "Long timers rolled back into the intake topic", registry=r)
        self.rebuilds = Counter("tidemq_scheduler_rebuilds",
                                "Timer stores rebuilt from the broker's intake topic "
                                "(empty, lost or corrupt data directory)", registry=r)
        self.rebuild_cancels = Counter("tidemq_scheduler_rebuild_cancels",
                                       "Cancelled ids read back from the broker by rebuilds",
                                       registry=r)
        for kind in ("timer", "level"):
            self.delivered_total.labels(kind)
            self.cancelled.labels(kind)

    @property
    def max_lateness_ms(self) -> int:
        return self.lateness.max_ms

    def add_gauges(self, source: Callable[[], Mapping[str, float]]) -> None:
        self.registry.register(StatsCollector("tidemq_scheduler_", source, SCHEDULER_STATS,
                                              "scheduler"))

    def delivered(self, count: int, lateness_ms: list[int], kind: str) -> None:
        self.delivered_total.labels(kind).inc(count)
        self.lateness.observe_ms(lateness_ms)
