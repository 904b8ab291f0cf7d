"""Replication gauges, read at scrape time (``tidemq_broker_replication_*``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from tidemq_server.broker.replication.manager import ReplicationManager

P = "tidemq_broker_replication_"


class ReplicationCollector(Collector):
    def __init__(self, manager: ReplicationManager) -> None:
        self.m = manager

    def collect(self) -> Iterator[Metric]:
        m = self.m
        role, quorum, follower = m.role, m.quorum, m.follower
        primary = role.is_primary
        yield GaugeMetricFamily(P + "primary", "1 while this broker is its group's primary",
                                value=1.0 if primary and not role.deposed else 0.0)
        yield GaugeMetricFamily(P + "epoch", "The group's leadership term this broker knows",
                                value=float(role.epoch))
        yield GaugeMetricFamily(P + "hwm", "High-water mark: records below it are visible",
                                value=float(m.visibility.hwm))
        yield GaugeMetricFamily(P + "in_sync_copies",
                                "Copies in sync, the primary included (primary only)",
                                value=float(quorum.insync_copies() if primary else 0))
        end = m.store.log.write_offset
        now = quorum.clock()
        lag = GaugeMetricFamily(P + "replica_lag_bytes", "Bytes a replica is behind (primary)",
                                labels=["broker_id", "address"])
        insync = GaugeMetricFamily(P + "replica_in_sync", "1 while a replica is in sync",
                                   labels=["broker_id", "address"])
        for r in quorum.replicas.values():
            labels = [str(r.broker_id), r.address]
            lag.add_metric(labels, float(max(0, end - r.written)))
            insync.add_metric(labels, 1.0 if quorum.in_sync(r, now) else 0.0)
        yield lag
        yield insync
        counters = {
            "fetches_served": m.source.stats["fetches"],
            "bytes_served": m.source.stats["fetched_bytes"],
            "fetches": follower.stats["fetches"],
            "fetched_bytes": follower.stats["fetched_bytes"],
            "fetched_records": follower.stats["fetched_records"],
            "fetch_errors": follower.stats["errors"],
            "truncated_bytes": follower.stats["truncated_bytes"],
            "refused_not_primary": m.gate.stats["refused_not_primary"],
            "refused_not_enough_replicas": m.gate.stats["refused_not_enough_replicas"],
            "quorum_timeouts": m.gate.stats["quorum_timeouts"],
            "role_changes": role.changes,
        }
        for key, value in counters.items():
            yield GaugeMetricFamily(P + key, f"replication: {key} since start", value=float(value))
        yield GaugeMetricFamily(P + "follower_lag_bytes",
                                "Bytes this replica is behind its primary's log end",
                                value=float(follower.lag_bytes()))
        yield GaugeMetricFamily(P + "out_of_range",
                                "1 when this replica is below its primary's retained log",
                                value=1.0 if follower.out_of_range else 0.0)
        yield GaugeMetricFamily(P + "quorum_waiting", "Sync sends waiting for the quorum",
                                value=float(quorum.waiting()))
