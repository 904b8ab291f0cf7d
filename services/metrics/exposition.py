"""Rollups → Prometheus text exposition (format 0.0.4), written atomically.

Every family has HELP and TYPE lines; counters end in ``_total``, times are in seconds. Each
(producer group, topic) that has been seen gets every counter (zeros included) so rates and
ratios work from its first event. Histograms and quantiles appear per resolution outcome once
that outcome has happened. Names (all ``tidemq_``):

====================================================  ==========  ==================================
tidemq_transaction_half_messages_total                counter     group, topic
tidemq_transaction_commits_total                      counter     group, topic, source
tidemq_transaction_rollbacks_total                    counter     group, topic, source
tidemq_transaction_unknowns_total                     counter     group, topic, source
tidemq_transaction_checks_total                       counter     group, topic (checks sent)
tidemq_transaction_check_outcomes_total               counter     group, topic, outcome
tidemq_transaction_discards_total                     counter     group, topic
tidemq_transaction_resolution_seconds                 histogram   group, topic, outcome
tidemq_transaction_resolution_quantiles_seconds       summary     group, topic, outcome (p50/90/99)
tidemq_transaction_resolution_checks                  histogram   group, topic, outcome
tidemq_metrics_events_read_total                      counter     (every event read)
tidemq_metrics_malformed_events_total                 counter     reason
tidemq_metrics_batch_id / _batch_timestamp_seconds    gauge       the last batch written
====================================================  ==========  ==================================
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tidemq.protocol import EventKind, EventSource

from tidemq_server.metrics.events import MalformedReason
from tidemq_server.metrics.rollup import CHECK_BUCKETS, LATENCY_BUCKETS_S, QUANTILES, Rollup

PREFIX = "tidemq_transaction_"
Labels = Sequence[tuple[str, str]]


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value))


class Family:
    """One metric family: HELP, TYPE and its samples, rendered in a stable order."""

    def __init__(self, name: str, kind: str, help_text: str) -> None:
        self.name = name
        self.kind = kind
        self.help = help_text
        self.samples: list[tuple[str, Labels, float]] = []

    def add(self, labels: Labels, value: float, suffix: str = "") -> None:
        self.samples.append((suffix, labels, value))

    def histogram(self, labels: Labels, bounds: Sequence[float], cumulative: Sequence[int],
                  total: float, count: int) -> None:
        for bound, hits in zip(bounds, cumulative, strict=True):
            self.add([*labels, ("le", number(float(bound)))], hits, "_bucket")
        self.add([*labels, ("le", "+Inf")], count, "_bucket")
        self.add(labels, total, "_sum")
        self.add(labels, count, "_count")

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]
        for suffix, labels, value in self.samples:
            body = ",".join(f'{k}="{escape(v)}"' for k, v in labels)
            series = f"{self.name}{suffix}{{{body}}}" if body else f"{self.name}{suffix}"
            lines.append(f"{series} {number(value)}")
        return lines


@dataclass(frozen=True, slots=True)
class BatchInfo:
    batch_id: int
    timestamp_s: float  # when the batch's exposition was rendered (epoch seconds)


def _families() -> dict[str, Family]:
    specs = [
        ("half_messages_total", "counter", "Half messages stored"),
        ("commits_total", "counter", "Transactions committed, by who ended them"),
        ("rollbacks_total", "counter", "Transactions rolled back, by who ended them"),
        ("unknowns_total", "counter", "UNKNOWN answers, by who gave them"),
        ("checks_total", "counter", "Checks sent to producers"),
        ("check_outcomes_total", "counter", "Answers to checks, by outcome"),
        ("discards_total", "counter", "Half messages discarded after too many checks or too long"),
        ("resolution_seconds", "histogram", "Time from half message to its resolution"),
        ("resolution_quantiles_seconds", "summary",
         "Quantiles of the time from half message to resolution, since the job began"),
        ("resolution_checks", "histogram", "Checks a transaction had when it was resolved"),
    ]
    return {name: Family(PREFIX + name, kind, text) for name, kind, text in specs}


def render(rollups: Iterable[Rollup], info: BatchInfo) -> str:
    """The whole exposition for one batch's rollups (deterministic order)."""
    fam = _families()
    by_key = {r.key: r for r in rollups}
    malformed = {reason.value: 0 for reason in MalformedReason}
    read = 0
    pairs: set[tuple[str, str]] = set()
    for roll in by_key.values():
        read += roll.events
        if roll.reason:
            malformed[roll.reason] = malformed.get(roll.reason, 0) + roll.events
        else:
            pairs.add((roll.producer_group, roll.topic))

    def get(group: str, topic: str, event: EventKind) -> Rollup | None:
        return by_key.get((group, topic, event.value, ""))

    for group, topic in sorted(pairs):
        base = [("producer_group", group), ("topic", topic)]
        half, check, discard = (get(group, topic, e) for e in
                                (EventKind.HALF, EventKind.CHECK, EventKind.DISCARD))
        fam["half_messages_total"].add(base, half.events if half else 0)
        fam["checks_total"].add(base, check.events if check else 0)
        fam["discards_total"].add(base, discard.events if discard else 0)
        for event, name in ((EventKind.COMMIT, "commits_total"),
                            (EventKind.ROLLBACK, "rollbacks_total"),
                            (EventKind.UNKNOWN, "unknowns_total")):
            ended = get(group, topic, event)
            fam[name].add([*base, ("source", EventSource.PRODUCER.value)],
                          ended.from_producer if ended else 0)
            fam[name].add([*base, ("source", EventSource.CHECK.value)],
                          ended.from_check if ended else 0)
            fam["check_outcomes_total"].add([*base, ("outcome", event.value)],
                                            ended.from_check if ended else 0)
        for event in (EventKind.COMMIT, EventKind.ROLLBACK, EventKind.DISCARD):
            res = get(group, topic, event)
            if res is None or res.events == 0:
                continue
            labels = [*base, ("outcome", event.value)]
            fam["resolution_seconds"].histogram(labels, LATENCY_BUCKETS_S, res.latency_buckets,
                                                res.latency_sum_s, res.events)
            summary = fam["resolution_quantiles_seconds"]
            for q, value in zip(QUANTILES, res.latency_quantiles_s or (), strict=False):
                summary.add([*labels, ("quantile", number(q))], value)
            summary.add(labels, res.latency_sum_s, "_sum")
            summary.add(labels, res.events, "_count")
            fam["resolution_checks"].histogram(labels, CHECK_BUCKETS, res.check_buckets,
                                               res.checks_sum, res.events)

    lines: list[str] = []
    for family in fam.values():
        lines.extend(family.render())
    job = [
        Family("tidemq_metrics_events_read_total", "counter",
               "Events read from TIDE_SYS_TRANS_EVENTS, malformed ones included"),
        Family("tidemq_metrics_malformed_events_total", "counter",
               "Events that broke the fixed schema: counted, then skipped"),
        Family("tidemq_metrics_batch_id", "gauge", "Id of the last micro-batch written"),
        Family("tidemq_metrics_batch_timestamp_seconds", "gauge",
               "When the last micro-batch was written (Unix time)"),
    ]
    job[0].add([], read)
    for reason, count in sorted(malformed.items()):
        job[1].add([("reason", reason)], count)
    job[2].add([], info.batch_id)
    job[3].add([], round(info.timestamp_s, 3))
    for family in job:
        lines.extend(family.render())
    return "\n".join(lines) + "\n"
