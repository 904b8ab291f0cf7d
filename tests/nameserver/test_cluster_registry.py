"""BrokerRegistry with broker groups: members keyed by (broker_name, broker_id), roles, replicas
in routes, per-member goodbyes and expiry (fake clock)."""

from __future__ import annotations

import pytest

from tests.support.clock import FakeClock
from tidemq_server.nameserver.registry import BrokerRegistry, QueueRoute, TopicInfo

EXPIRY_MS = 120_000
RW8 = TopicInfo(queues=8, perm="rw")


@pytest.fixture
def registry(clock: FakeClock) -> BrokerRegistry:
    return BrokerRegistry(expiry_ms=EXPIRY_MS, clock=clock.ms, monotonic=clock.monotonic_ms)


def test_members_of_one_group_are_kept_apart(registry: BrokerRegistry) -> None:
    registry.heartbeat("c1", "broker-a", "http://a0:1", {"orders": RW8}, max_offset=4096,
                       grpc_address="a0:8081")
    registry.heartbeat("c1", "broker-a", "http://a1:1", {"orders": RW8}, broker_id=1,
                       role="replica", max_offset=2048)

    members = registry.brokers()
    assert [(b.broker_name, b.broker_id, b.role) for b in members] == [
        ("broker-a", 0, "primary"), ("broker-a", 1, "replica")]
    assert members[0].to_wire()["grpc_address"] == "a0:8081"
    assert members[0].to_wire()["max_offset"] == 4096
    assert members[1].to_wire()["grpc_address"] is None
    # one route entry per group: the primary, with its replica as a readable copy
    assert registry.routes("orders") == [
        QueueRoute("broker-a", "http://a0:1", 8, "rw", replicas=("http://a1:1",))]
    assert registry.routes("orders")[0].to_wire()["replicas"] == ["http://a1:1"]


def test_route_merges_every_group(registry: BrokerRegistry) -> None:
    registry.heartbeat("c1", "broker-b", "http://b:1", {"orders": TopicInfo(4, "rw")})
    registry.heartbeat("c1", "broker-a", "http://a:1", {"orders": RW8})

    route = registry.routes("orders")
    assert [(q.broker_name, q.queues, q.replicas) for q in route] == [
        ("broker-a", 8, ()), ("broker-b", 4, ())]
    assert sum(q.queues for q in route) == 12


def test_a_group_without_live_primary_is_read_only_at_its_best_replica(
        registry: BrokerRegistry, clock: FakeClock) -> None:
    registry.heartbeat("c1", "broker-a", "http://a0:1", {"orders": RW8})
    clock.advance(100)
    registry.heartbeat("c1", "broker-a", "http://a1:1", {"orders": RW8}, broker_id=1,
                       role="replica", max_offset=500)
    registry.heartbeat("c1", "broker-a", "http://a2:1", {"orders": RW8}, broker_id=2,
                       role="replica", max_offset=900)
    clock.advance(20)  # the primary is 120 s silent, the replicas 20 s
    assert registry.routes("orders") == [
        QueueRoute("broker-a", "http://a2:1", 8, "r", replicas=("http://a1:1", "http://a2:1"))]
    assert [(b.broker_id, b.role) for b in registry.brokers()] == [(1, "replica"),
                                                                    (2, "replica")]
    registry.heartbeat("c1", "broker-a", "http://a1:1", {"orders": TopicInfo(8, "w")},
                       broker_id=1, role="replica", max_offset=950)
    assert registry.routes("orders") == []  # a write-only topic has nothing to read


def test_a_newer_primary_drops_the_deposed_claim_at_once(registry: BrokerRegistry) -> None:
    registry.heartbeat("c1", "broker-a", "http://a0:1", {"orders": RW8}, epoch=3)
    registry.heartbeat("c1", "broker-a", "http://a1:1", {"orders": RW8}, broker_id=1,
                       role="replica", epoch=3)
    registry.heartbeat("c1", "broker-a", "http://a2:1", {"orders": RW8}, broker_id=2,
                       epoch=4)
    assert [(b.broker_id, b.role, b.epoch) for b in registry.brokers()] == [
        (1, "replica", 3), (2, "primary", 4)]
    assert registry.routes("orders") == [
        QueueRoute("broker-a", "http://a2:1", 8, "rw", replicas=("http://a1:1",))]
    # the deposed primary, back as a replica, is listed again
    registry.heartbeat("c1", "broker-a", "http://a0:1", {"orders": RW8}, role="replica",
                       epoch=4)
    assert registry.routes("orders")[0].replicas == ("http://a0:1", "http://a1:1")


def test_newer_epoch_wins_between_two_primaries(registry: BrokerRegistry) -> None:
    registry.heartbeat("c1", "broker-a", "http://old:1", {"orders": RW8}, epoch=3)
    registry.heartbeat("c1", "broker-a", "http://new:1", {"orders": RW8}, broker_id=2, epoch=4)
    assert [q.address for q in registry.routes("orders")] == ["http://new:1"]


def test_a_deposed_primary_heartbeating_late_is_not_listed_again(
        registry: BrokerRegistry) -> None:
    """Cut off from etcd but not from the nameserver, the old primary heartbeats as primary
    under its old epoch after its successor registered: one primary stays listed."""
    registry.heartbeat("c1", "broker-a", "http://a0:1", {"orders": RW8}, epoch=3)
    registry.heartbeat("c1", "broker-a", "http://a1:1", {"orders": RW8}, broker_id=1, epoch=4)
    assert registry.heartbeat("c1", "broker-a", "http://a0:1", {"orders": RW8},
                              epoch=3) is None
    assert [(b.broker_id, b.role, b.epoch) for b in registry.brokers()] == [(1, "primary", 4)]
    assert [q.address for q in registry.routes("orders")] == ["http://a1:1"]
    # a replica that already follows the new epoch is enough to refuse the stale claim
    registry.heartbeat("c1", "broker-a", "http://a2:1", {"orders": RW8}, broker_id=2,
                       role="replica", epoch=5)
    assert registry.heartbeat("c1", "broker-a", "http://a1:1", {"orders": RW8}, broker_id=1,
                              epoch=4) is None
    assert [(b.broker_id, b.role) for b in registry.brokers()] == [(2, "replica")]
    assert registry.routes("orders") == [
        QueueRoute("broker-a", "http://a2:1", 8, "r", replicas=("http://a2:1",))]
    # following the new primary, the old one is listed again, as a replica
    registry.heartbeat("c1", "broker-a", "http://a0:1", {"orders": RW8}, role="replica",
                       epoch=5)
    assert [(b.broker_id, b.role) for b in registry.brokers()] == [(0, "replica"),
                                                                   (2, "replica")]


def test_goodbye_of_one_member_keeps_the_others(registry: BrokerRegistry) -> None:
    registry.heartbeat("c1", "broker-a", "http://a0:1", {"orders": RW8})
    registry.heartbeat("c1", "broker-a", "http://a1:1", {"orders": RW8}, broker_id=1,
                       role="replica")

    assert registry.unregister("broker-a", "http://a1:1", broker_id=0) is False  # wrong pair
    assert registry.unregister("broker-a", "http://a1:1", broker_id=1) is True
    assert [b.broker_id for b in registry.brokers()] == [0]
    assert registry.routes("orders")[0].replicas == ()
    assert registry.unregister("broker-a", broker_id=1) is False
    assert registry.unregister("broker-a") is True  # no id: every member of the group
    assert registry.brokers() == []


def test_each_member_expires_on_its_own(registry: BrokerRegistry, clock: FakeClock) -> None:
    registry.heartbeat("c1", "broker-a", "http://a0:1", {"orders": RW8})
    clock.advance(60)
    registry.heartbeat("c1", "broker-a", "http://a1:1", {}, broker_id=1, role="replica")
    clock.advance(60)
    assert [(b.broker_name, b.broker_id) for b in registry.expire()] == [("broker-a", 0)]
    assert [b.broker_id for b in registry.brokers()] == [1]
