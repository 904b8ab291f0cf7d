"""Source offsets, read limits and batch splitting (pure)."""

from __future__ import annotations

from tidemq_server.metrics import planning
from tidemq_server.metrics.planning import QueueRange

A, B, F = "broker-a", "broker-b", planning.FIXED


def test_offsets_round_trip_through_spark_form() -> None:
    offsets = {(F, 3): 10, (F, 0): 7}
    spark_form = planning.to_spark(offsets)
    assert spark_form == {"queues": {"0": 7, "3": 10}}  # one fixed broker: the one-broker form
    assert planning.from_spark(spark_form) == offsets
    assert planning.from_spark(None) == {} and planning.from_spark({"x": 1}) == {}
    assert planning.to_spark({}) == {"queues": {}}


def test_offsets_of_several_groups_are_kept_per_broker() -> None:
    offsets = {(B, 0): 4, (A, 1): 9, (A, 0): 2}
    spark_form = planning.to_spark(offsets)
    assert spark_form == {"brokers": {A: {"0": 2, "1": 9}, B: {"0": 4}}}
    assert planning.from_spark(spark_form) == offsets
    assert planning.brokers_of(offsets) == {A, B}
    legacy = planning.from_spark({"queues": {"0": 5}})
    assert planning.rename(legacy, F, A) == {(A, 0): 5}


def test_advance_without_a_limit_reads_everything_and_never_goes_back() -> None:
    start = {0: 5, 1: 9}
    latest = {0: 8, 1: 4, 2: 3}  # queue 1 went "back" (a truncated tail); queue 2 is new
    assert planning.advance(start, latest, None) == {0: 8, 1: 9, 2: 3}
    # a group that did not answer is missing from latest: its queues stay where they are
    assert planning.advance({(A, 0): 5, (B, 0): 7}, {(A, 0): 9}, None) == {(A, 0): 9, (B, 0): 7}


def test_advance_shares_a_read_limit_fairly_between_queues() -> None:
    start = {0: 0, 1: 0, 2: 0}
    latest = {0: 100, 1: 2, 2: 100}
    end = planning.advance(start, latest, 50)
    assert sum(end.values()) == 50
    assert end[1] == 2  # the small queue gets all it has; the rest is split
    assert abs(end[0] - end[2]) <= 1
    assert planning.advance(start, latest, 0) == start
    assert planning.advance(start, latest, 1000) == latest


def test_cap_freezes_the_end_for_available_now() -> None:
    assert planning.cap({0: 10, 1: 5}, {0: 7}) == {0: 7, 1: 5}
    assert planning.cap({0: 10}, None) == {0: 10}


def test_split_cuts_each_queue_into_tasks() -> None:
    ranges = planning.split({(F, 0): 0, (F, 1): 10}, {(F, 0): 25, (F, 1): 10, (F, 2): 4}, 10)
    assert ranges == [QueueRange(0, 0, 10), QueueRange(0, 10, 20), QueueRange(0, 20, 25),
                      QueueRange(2, 0, 4)]
    assert sum(r.size for r in ranges) == 29


def test_split_carries_each_groups_address() -> None:
    ranges = planning.split({(A, 0): 3}, {(A, 0): 5, (B, 0): 2}, 10,
                            {A: "http://a", B: "http://b"})
    assert ranges == [QueueRange(0, 3, 5, A, "http://a"), QueueRange(0, 0, 2, B, "http://b")]
