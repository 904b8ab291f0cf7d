"""The broker's Prometheus metrics (``tidemq_broker_*``), on a registry of its own.

Counted per request batch, never per message, so metrics stay off the send hot path. Store
statistics are read only at scrape time through ``StatsCollector``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.broker.store.types import MessageRecord, PutStatus

log = logging.getLogger(__name__)

_NAME_RE = re.compile(r"[^a-zA-Z0-9_]")
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class StatsCollector(Collector):
    """Exposes a ``dict[str, float]`` (e.g. ``store.stats()``) as gauges, read at scrape time."""

    def __init__(self, prefix: str, source: Callable[[], dict[str, float]], what: str) -> None:
        self.prefix = prefix
        self.source = source
        self.what = what

    def collect(self) -> Iterator[Metric]:
        try:
            stats = self.source()
        except Exception:  # a scrape must not fail because one source did
            log.exception("%s statistics unavailable", self.what)
            return
        for key, value in sorted(stats.items()):
            name = self.prefix + _NAME_RE.sub("_", key)
            yield GaugeMetricFamily(name, f"{self.what}: {key}", value=float(value))


class BrokerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.messages_put = Counter("tidemq_broker_messages_put",
                                    "Messages stored by public sends", ["topic"], registry=r)
        self.put_bytes = Counter("tidemq_broker_put_bytes",
                                 "Body bytes stored by public sends", ["topic"], registry=r)
        self.put_requests = Counter("tidemq_broker_put_requests",
                                    "Store writes by outcome (ok, busy, disk_full, unavailable)",
                                    ["status"], registry=r)
        self.busy_rejections = Counter("tidemq_broker_busy_rejections",
                                       "Send batches refused with BROKER_BUSY", registry=r)
        self.put_latency = Histogram("tidemq_broker_put_latency_seconds",
                                     "Time of one store write (a whole batch)",
                                     buckets=LATENCY_BUCKETS, registry=r)
        self.dedup_hits = Counter("tidemq_broker_dedup_hits",
                                  "Messages answered with an earlier result (idempotent send)",
                                  registry=r)
        self.pulls = Counter("tidemq_broker_pulls", "Pull requests by result (found, empty)",
                             ["result"], registry=r)
        self.pulled_messages = Counter("tidemq_broker_pulled_messages",
                                       "Messages returned by pulls", ["topic"], registry=r)
        self.consumer_lag = Gauge("tidemq_broker_consumer_lag",
                                  "Messages behind the queue end at a group's last pull",
                                  ["group", "topic", "queue_id"], registry=r)
        self.retries = Counter("tidemq_broker_retries",
                               "Messages sent back for retry, by destination (retry, dlq)",
                               ["destination"], registry=r)
        for status in PutStatus:
            self.put_requests.labels(status.value)
        for result in ("found", "empty"):
            self.pulls.labels(result)
        self._topic_children: dict[str, tuple[Counter, Counter]] = {}

    def add_stats(self, prefix: str, source: Callable[[], dict[str, float]], what: str) -> None:
        self.registry.register(StatsCollector(prefix, source, what))

    def observe_put(self, topic: str, records: Sequence[MessageRecord], status: PutStatus,
                    seconds: float) -> None:
        self.observe_put_of(topic, len(records), sum(len(r.body) for r in records), status,
                            seconds)

    def observe_put_of(self, topic: str, count: int, nbytes: int, status: PutStatus,
                       seconds: float) -> None:
        """``observe_put`` of ``count`` messages of ``nbytes`` (bodies and properties)."""
        self.put_requests.labels(status.value).inc()
        self.put_latency.observe(seconds)
        if status is PutStatus.OK:
            children = self._topic_children.get(topic)
            if children is None:
                children = (self.messages_put.labels(topic), self.put_bytes.labels(topic))
                self._topic_children[topic] = children
            children[0].inc(count)
            children[1].inc(nbytes)
        elif status is PutStatus.BUSY:
            self.busy_rejections.inc()

    def observe_pull(self, topic: str, count: int) -> None:
        if count:
            self.pulls.labels("found").inc()
            self.pulled_messages.labels(topic).inc(count)
        else:
            self.pulls.labels("empty").inc()
