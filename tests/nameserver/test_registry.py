"""BrokerRegistry on a fake clock: registration, routes, topic replacement, expiry."""

from __future__ import annotations

import pytest

from tests.support.clock import FakeClock
from tidemq_server.nameserver.registry import BrokerRegistry, QueueRoute, TopicInfo

EXPIRY_MS = 120_000
RW8 = TopicInfo(queues=8, perm="rw")


@pytest.fixture
def registry(clock: FakeClock) -> BrokerRegistry:
    return BrokerRegistry(expiry_ms=EXPIRY_MS, clock=clock.ms, monotonic=clock.monotonic_ms)


def test_heartbeat_registers_broker_and_its_routes(registry: BrokerRegistry,
                                                   clock: FakeClock) -> None:
    registry.heartbeat("c1", "broker-a", "http://127.0.0.1:10911",
                       {"orders": RW8, "audit": TopicInfo(queues=2, perm="r")})

    assert registry.routes("orders") == [QueueRoute("broker-a", "http://127.0.0.1:10911", 8, "rw")]
    assert registry.routes("audit") == [QueueRoute("broker-a", "http://127.0.0.1:10911", 2, "r")]
    assert registry.routes("unknown") == []
    assert registry.topics() == {"orders", "audit"}
    [broker] = registry.brokers()
    assert broker.to_wire() == {
        "cluster": "c1", "broker_name": "broker-a", "broker_id": 0, "role": "primary",
        "epoch": 0, "address": "http://127.0.0.1:10911", "internal_address": None,
        "grpc_address": None, "max_offset": 0,
        "last_heartbeat_ms": clock.wall_ms,
        "topics": {"audit": {"queues": 2, "perm": "r"}, "orders": {"queues": 8, "perm": "rw"}},
    }


def test_routes_give_the_advertised_address_and_the_cluster_view_both(
        registry: BrokerRegistry) -> None:
    # compose: clients on the host use the published port, the other services the container
    registry.heartbeat("c1", "broker-a", "https://127.0.0.1:10911", {"orders": RW8},
                       internal_address="https://broker-a:10911")
    assert [r.address for r in registry.routes("orders")] == ["https://127.0.0.1:10911"]
    [broker] = registry.brokers()
    wire = broker.to_wire()
    assert (wire["address"], wire["internal_address"]) == ("https://127.0.0.1:10911",
                                                           "https://broker-a:10911")


def test_heartbeat_replaces_the_topic_set(registry: BrokerRegistry) -> None:
    registry.heartbeat("c1", "broker-a", "http://a:1", {"orders": RW8, "old": RW8})
    registry.heartbeat("c1", "broker-a", "http://a:1",
                       {"orders": TopicInfo(queues=16, perm="w"), "new": RW8})

    assert registry.routes("old") == []
    assert registry.routes("new")[0].broker_name == "broker-a"
    assert registry.routes("orders") == [QueueRoute("broker-a", "http://a:1", 16, "w")]
    assert registry.topics() == {"orders", "new"}


def test_heartbeat_with_no_topics_keeps_broker_but_no_routes(registry: BrokerRegistry) -> None:
    registry.heartbeat("c1", "broker-a", "http://a:1", {"orders": RW8})
    registry.heartbeat("c1", "broker-a", "http://a:1", {})

    assert registry.routes("orders") == []
    assert [b.broker_name for b in registry.brokers()] == ["broker-a"]


def test_broker_expires_after_120_s_of_silence(registry: BrokerRegistry,
                                               clock: FakeClock) -> None:
    registry.heartbeat("c1", "broker-a", "http://a:1", {"orders": RW8})

    clock.advance(119.999)
    assert registry.expire() == []
    assert len(registry.routes("orders")) == 1

    clock.advance(0.001)  # exactly 120 s since the heartbeat
    assert registry.routes("orders") == []  # reads hide it even before the sweep
    assert registry.brokers() == []
    expired = registry.expire()
    assert [b.broker_name for b in expired] == ["broker-a"]
    assert registry.expire() == []
    assert len(registry) == 0


def test_heartbeats_keep_a_broker_alive(registry: BrokerRegistry, clock: FakeClock) -> None:
    registry.heartbeat("c1", "broker-a", "http://a:1", {"orders": RW8})
    for _ in range(10):
        clock.advance(30)
        registry.heartbeat("c1", "broker-a", "http://a:1", {"orders": RW8})
        assert registry.expire() == []
    assert registry.brokers()[0].last_heartbeat_ms == clock.wall_ms


def test_expired_broker_comes_back_with_its_next_heartbeat(registry: BrokerRegistry,
                                                           clock: FakeClock) -> None:
    registry.heartbeat("c1", "broker-a", "http://a:1", {"orders": RW8})
    clock.advance(200)
    registry.expire()
    registry.heartbeat("c1", "broker-a", "http://a:2", {"orders": RW8})

    assert registry.routes("orders") == [QueueRoute("broker-a", "http://a:2", 8, "rw")]


def test_several_brokers_serve_one_topic(registry: BrokerRegistry, clock: FakeClock) -> None:
    registry.heartbeat("c1", "broker-b", "http://b:1", {"orders": TopicInfo(4, "rw")})
    registry.heartbeat("c1", "broker-a", "http://a:1", {"orders": RW8, "only-a": RW8})
    clock.advance(60)
    registry.heartbeat("c2", "broker-c", "http://c:1", {"orders": TopicInfo(2, "r")})

    assert registry.routes("orders") == [
        QueueRoute("broker-a", "http://a:1", 8, "rw"),
        QueueRoute("broker-b", "http://b:1", 4, "rw"),
        QueueRoute("broker-c", "http://c:1", 2, "r"),
    ]
    assert [b.broker_name for b in registry.routes("only-a")] == ["broker-a"]

    clock.advance(60)  # a and b are now 120 s silent; c heartbeated 60 s ago
    assert [r.broker_name for r in registry.routes("orders")] == ["broker-c"]
    assert {b.broker_name for b in registry.expire()} == {"broker-a", "broker-b"}
    assert registry.routes("only-a") == []
    assert [(b.cluster, b.broker_name) for b in registry.brokers()] == [("c2", "broker-c")]


def test_cluster_view_is_sorted_by_cluster_then_name(registry: BrokerRegistry) -> None:
    registry.heartbeat("c2", "broker-a", "http://a:1", {})
    registry.heartbeat("c1", "broker-z", "http://z:1", {})
    registry.heartbeat("c1", "broker-m", "http://m:1", {})

    assert [(b.cluster, b.broker_name) for b in registry.brokers()] == [
        ("c1", "broker-m"), ("c1", "broker-z"), ("c2", "broker-a")]


def test_same_name_from_new_address_replaces_the_registration(registry: BrokerRegistry) -> None:
    registry.heartbeat("c1", "broker-a", "http://a:1", {"orders": RW8})
    registry.heartbeat("c1", "broker-a", "http://a:2", {"orders": RW8})

    assert [r.address for r in registry.routes("orders")] == ["http://a:2"]


def test_unregister_only_matching_address(registry: BrokerRegistry) -> None:
    registry.heartbeat("c1", "broker-a", "http://a:2", {"orders": RW8})

    assert registry.unregister("broker-a", "http://a:1") is False  # a stale goodbye
    assert len(registry.routes("orders")) == 1
    assert registry.unregister("broker-a", "http://a:2") is True
    assert registry.routes("orders") == []
    assert registry.unregister("broker-a") is False


def test_expiry_must_be_positive(clock: FakeClock) -> None:
    with pytest.raises(ValueError, match="positive"):
        BrokerRegistry(expiry_ms=0, clock=clock.ms)


@pytest.mark.parametrize("step_s", [3600.0, -3600.0])
def test_a_wall_clock_step_neither_expires_nor_keeps_brokers(registry: BrokerRegistry,
                                                             clock: FakeClock,
                                                             step_s: float) -> None:
    registry.heartbeat("c1", "broker-a", "http://a:1", {"orders": RW8})
    stamped = clock.wall_ms

    clock.step_wall(step_s)  # NTP step or a resumed VM: the monotonic clock did not move
    assert registry.expire() == []
    assert [r.broker_name for r in registry.routes("orders")] == ["broker-a"]
    assert registry.brokers()[0].last_heartbeat_ms == stamped  # shown as it was stamped

    clock.advance(120)  # 120 s of real silence still expires it, wherever the wall clock is
    assert registry.routes("orders") == []
    assert [b.broker_name for b in registry.expire()] == ["broker-a"]


def test_last_heartbeat_shows_the_wall_clock(registry: BrokerRegistry, clock: FakeClock) -> None:
    clock.step_wall(-10)
    registry.heartbeat("c1", "broker-a", "http://a:1", {})
    assert registry.brokers()[0].to_wire()["last_heartbeat_ms"] == clock.wall_ms
    assert "seen_ms" not in registry.brokers()[0].to_wire()
