"""The broker's Prometheus metrics (``tidemq_broker_*``), on a registry of its own.

Counted per request batch, never per message, so metrics stay off the send hot path. Store
statistics are read only at scrape time through ``StatsCollector``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tidemq_server.broker.store.types import MessageRecord, PutStatus
from tidemq_server.common.stats import Stat, StatsCollector, counter

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


#: ``Store.stats()`` (``tidemq_broker_store_*``)
STORE_STATS: dict[str, Stat] = {
    "put_requests": counter("Requests the group-commit writer stored (a request holds one or "
                            "more records)"),
    "put_records": counter("Records the group-commit writer stored"),
    "put_bytes": counter("Bytes of records the group-commit writer stored"),
    "writes": counter("Group-commit writes to the commit log (each covers many requests)"),
    "fsyncs": counter("fsync calls on the commit log"),
    "busy": counter("Requests the writer refused with BROKER_BUSY (queue too deep or too old)",
                    "busy_rejections"),
    "writer_failed": Stat("1 when the writer stopped on an error and refuses every write until a "
                          "restart"),
    "commitlog_min_offset": Stat("First physical offset still stored in the commit log (bytes)"),
    "commitlog_max_offset": Stat("Physical offset the next record will get (bytes)"),
    "commitlog_synced_offset": Stat("Physical offset up to which the commit log is fsynced "
                                    "(bytes)"),
    "commitlog_segments": Stat("Commit log segment files"),
    "consume_queues": Stat("Consume queues (topic, queue id) built from the commit log"),
    "index_files": Stat("Index files (message id and key to physical offset)"),
    "disk_used_ratio": Stat("Used share of the store's file system (0..1)"),
    "recovery_seconds": Stat("How long the last start's recovery of the store took (seconds)"),
}

#: ``Broker.stats()`` (``tidemq_broker_*``)
BROKER_STATS: dict[str, Stat] = {
    "topics": Stat("Topics this broker serves"),
    "dedup_entries": Stat("Message ids held for idempotent sends (the dedup window)"),
    "held_pulls": Stat("Long-poll pulls waiting for a message"),
    "held_pulls_woken": counter("Held pulls woken by a new message"),
    "offset_commit_round_trips": counter("Redis round trips that committed consumer offsets "
                                         "(concurrent commits share one)"),
    "simple_delivered": counter("Messages handed out by simple-consumer receives"),
    "simple_acked": counter("Messages acknowledged by simple consumers"),
}

#: ``TransactionService.stats()`` (``tidemq_broker_transactions_*``)
TRANSACTION_STATS: dict[str, Stat] = {
    "pending": Stat("Half messages not yet committed, rolled back or discarded"),
    "loads": counter("Times the transaction table was rebuilt from the log (start, promotion)"),
    "checks_held": Stat("Check-back requests waiting for a producer of their group"),
    "checks_offered": counter("Check-back requests the checker offered"),
    "checks_handed_out": counter("Check-back requests handed to a polling producer"),
    "checks_expired": counter("Check-back requests no producer took in time"),
    "check_pollers": Stat("Producers long-polling for check-back requests"),
    "check_polls_woken": counter("Producer check polls woken by a new check-back request"),
}

#: ``GrpcDoor.stats()`` (``tidemq_broker_grpc_*``)
GRPC_STATS: dict[str, Stat] = {
    "sessions": Stat("RocketMQ 5 client sessions on the gRPC door"),
    "telemetry_streams": Stat("Open Telemetry streams of RocketMQ 5 clients"),
    "check_pumps": Stat("Transaction check pumps feeding RocketMQ 5 producers"),
}


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

    def add_stats(self, prefix: str, source: Callable[[], Mapping[str, float]],
                  specs: Mapping[str, Stat], what: str) -> None:
        self.registry.register(StatsCollector(prefix, source, specs, what))

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
