from __future__ import annotations

import zlib

import pytest
from tidemq._exceptions import TopicNotFoundError
from tidemq._routes import BrokerRoute, TopicRoute, parse_route
from tidemq._selector import QueueSelector, shard_index

ROUTE = TopicRoute("t", (BrokerRoute("b", "http://b1", 4), BrokerRoute("a", "http://a1", 2),
                         BrokerRoute("r", "http://r1", 8, perm="r")))


def test_write_queues_are_sorted_by_broker_and_skip_read_only_brokers() -> None:
    assert [(q.broker_name, q.queue_id) for q in ROUTE.write_queues()] == [
        ("a", 0), ("a", 1), ("b", 0), ("b", 1), ("b", 2), ("b", 3)]
    assert len(ROUTE.read_queues()) == 14


def test_round_robin_cycles_over_every_queue_of_every_broker() -> None:
    selector = QueueSelector()
    picks = [selector.select(ROUTE) for _ in range(12)]
    assert sorted(picks) == sorted(ROUTE.write_queues() * 2)
    assert picks[:6] == picks[6:]


def test_round_robin_is_select_without_arguments() -> None:
    """The send hot path's call picks what ``select(route)`` picks, and refuses alike."""
    a, b = QueueSelector(), QueueSelector()
    a._next["t"] = b._next["t"] = 5
    assert [a.round_robin(ROUTE) for _ in range(9)] == [b.select(ROUTE) for _ in range(9)]
    frozen = TopicRoute("t", (BrokerRoute("a", "http://a1", 2, perm="r"),))
    with pytest.raises(TopicNotFoundError, match="no broker accepts writes"):
        a.round_robin(frozen)
    with pytest.raises(TopicNotFoundError, match="no broker accepts writes"):
        a.select(frozen)


def test_round_robin_over_a_brokers_queues_is_select_with_that_broker() -> None:
    a, b = QueueSelector(), QueueSelector()
    a._next["t"] = b._next["t"] = 7
    mine = [q for q in ROUTE.write_queues() if q.address == "http://b1"]
    assert [a.round_robin_over("t", mine) for _ in range(9)] == \
        [b.select(ROUTE, broker="http://b1") for _ in range(9)]


def test_sharding_key_is_stable_across_selectors_and_calls() -> None:
    a, b = QueueSelector(), QueueSelector()
    for key in ("user-1", "user-2", "order-99", "ünïcode"):
        q = a.select(ROUTE, sharding_key=key)
        assert q == b.select(ROUTE, sharding_key=key) == a.select(ROUTE, sharding_key=key)
        assert q == ROUTE.write_queues()[zlib.crc32(key.encode()) % 6]
    assert shard_index("user-7", 4) == zlib.crc32(b"user-7") % 4


def test_explicit_queue_and_broker_restriction() -> None:
    s = QueueSelector()
    assert s.select(ROUTE, queue_id=3).address == "http://b1"
    assert s.select(ROUTE, queue_id=1).address == "http://a1"
    assert {s.select(ROUTE, broker="http://b1").address for _ in range(8)} == {"http://b1"}


def test_parse_route_normalizes_addresses() -> None:
    route = parse_route("t", {"topic": "t", "queues": [
        {"broker_name": "b", "address": "127.0.0.1:10911", "queues": 8, "perm": "rw"}]})
    assert route.brokers[0].address == "http://127.0.0.1:10911"
