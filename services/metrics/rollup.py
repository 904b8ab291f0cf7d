"""What the job computes, independent of Spark: the aggregate row, its buckets, and a plain
Python implementation of the same aggregation (the benchmark's baseline and the tests' oracle).

One ``Rollup`` per ``(producer_group, topic, event, malformed reason)``:

- ``events``: how many; ``from_producer`` / ``from_check``: split by the event's ``source``;
- for resolutions (commit, rollback, discard) the half-to-resolution time ``ts_ms - born_ms``
  (seconds, never negative) as cumulative histogram buckets, a sum and p50/p90/p99;
- for every event the ``check_times`` it carried as cumulative buckets and a sum (at a
  resolution: how many checks the transaction needed).

Malformed events have empty group, topic and event fields and their reason in ``reason``.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass, field

from tidemq_server.metrics.events import RESOLUTIONS, EventRow

LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
    21600.0, 86400.0,
)  # half-to-resolution upper bounds (s); +Inf is implied
CHECK_BUCKETS: tuple[int, ...] = (0, 1, 2, 3, 5, 10, 15)  # checks per transaction; +Inf implied
QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99)
PERCENTILE_ACCURACY = 10_000  # percentile_approx accuracy: relative rank error ≤ 1/this

GroupKey = tuple[str, str, str, str]  # producer_group, topic, event, malformed reason ("")


@dataclass(slots=True)
class Rollup:
    producer_group: str
    topic: str
    event: str
    reason: str  # "" for a valid event, else the MalformedReason
    events: int = 0
    from_producer: int = 0
    from_check: int = 0
    latency_sum_s: float = 0.0
    latency_buckets: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS_S))
    latency_quantiles_s: list[float] | None = None  # QUANTILES order; None: no resolutions
    checks_sum: int = 0
    check_buckets: list[int] = field(default_factory=lambda: [0] * len(CHECK_BUCKETS))

    @property
    def key(self) -> GroupKey:
        return (self.producer_group, self.topic, self.event, self.reason)

    @property
    def is_resolution(self) -> bool:
        return not self.reason and self.event in RESOLUTIONS


def latency_s(born_ms: int, ts_ms: int) -> float:
    """Half-to-resolution time in seconds (a clock step backwards counts as 0)."""
    return max(0, ts_ms - born_ms) / 1000.0


def exact_quantile(ordered: list[float], q: float) -> float:
    """The q-quantile of sorted values as percentile_approx defines it: the smallest value
    whose rank reaches ``ceil(q * n)``."""
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def python_rollup(rows: Iterable[EventRow]) -> list[Rollup]:
    """The job's aggregation in one plain loop (``rows`` as ``events.parse_event`` gives them).

    Quantiles here are exact; Spark's are within 1/PERCENTILE_ACCURACY in rank.
    """
    groups: dict[GroupKey, Rollup] = {}
    latencies: dict[GroupKey, list[float]] = {}
    lat_bounds = LATENCY_BUCKETS_S
    chk_bounds = CHECK_BUCKETS
    resolutions = frozenset(RESOLUTIONS)
    for event, source, group, topic, _tx, _mid, checks, born, ts, reason in rows:
        key = (group, topic, event, reason or "")
        roll = groups.get(key)
        if roll is None:
            roll = groups[key] = Rollup(group, topic, event, reason or "")
        roll.events += 1
        if reason:
            continue
        if source == "producer":
            roll.from_producer += 1
        else:
            roll.from_check += 1
        roll.checks_sum += checks
        for i in range(bisect_left(chk_bounds, checks), len(chk_bounds)):
            roll.check_buckets[i] += 1
        if event in resolutions:
            lat = max(0, ts - born) / 1000.0
            roll.latency_sum_s += lat
            for i in range(bisect_left(lat_bounds, lat), len(lat_bounds)):
                roll.latency_buckets[i] += 1
            latencies.setdefault(key, []).append(lat)
    for key, values in latencies.items():
        values.sort()
        groups[key].latency_quantiles_s = [exact_quantile(values, q) for q in QUANTILES]
    return sorted(groups.values(), key=lambda r: r.key)
