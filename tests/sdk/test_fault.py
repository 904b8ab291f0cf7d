"""``BrokerHealth`` (per-broker back-off with probes) and ``SendAttempts`` (where a failed send
goes next), on a hand-driven clock."""

from __future__ import annotations

import time

import pytest
from tidemq import (
    BadRequestError,
    BrokerBusyError,
    InternalServerError,
    NotEnoughReplicasError,
    NotPrimaryError,
    RequestTimeoutError,
    RetryPolicy,
    TopicNotFoundError,
    TransportError,
)
from tidemq._constants import MAYBE_STORED_STICK_S
from tidemq._fault import BrokerHealth, Outcome, SendAttempts, Step, outcome
from tidemq._routes import BrokerRoute, TopicRoute
from tidemq._selector import QueueSelector

from tests.support.clock import FakeClock


def health(clock: FakeClock) -> BrokerHealth:
    return BrokerHealth(initial_s=1.0, max_s=4.0, probe_timeout_s=2.0, clock=clock)


def test_backoff_doubles_per_outage_up_to_the_cap_and_a_success_forgets_it() -> None:
    clock = FakeClock()
    h = health(clock)
    assert h.usable("b") and not h
    assert h.failed("b") is True  # newly down: the one loud log line
    assert not h.usable("b") and h.wait_s("b") == 1.0
    assert h.failed("b") is False  # the same outage seen by another request: not counted
    assert h.failures("b") == 1
    pauses = []
    for _ in range(4):
        clock.now += h.wait_s("b")
        assert h.usable("b")
        h.failed("b")  # the probe failed
        pauses.append(h.wait_s("b"))
    assert pauses == [2.0, 4.0, 4.0, 4.0]
    assert h.succeeded("b") is True and h.usable("b") and h.failures("b") == 0
    assert h.succeeded("b") is False


def test_one_probe_at_a_time_once_the_backoff_has_passed() -> None:
    clock = FakeClock()
    h = health(clock)
    h.failed("b")
    clock.now += 1.0
    assert h.usable("b")
    h.claim("b")  # this request is the probe
    assert not h.usable("b")  # the others keep away while it is out
    clock.now += 2.0  # the probe never answered: another may go
    assert h.usable("b")
    h.claim("healthy")  # claiming a broker without failures changes nothing
    assert h.usable("healthy")


def test_outcomes() -> None:
    assert outcome(TransportError("refused", sent=False)) is Outcome.NOT_STORED
    assert outcome(TransportError("reset")) is Outcome.MAYBE_STORED
    assert outcome(RequestTimeoutError("slow")) is Outcome.MAYBE_STORED
    assert outcome(BrokerBusyError("BROKER_BUSY", "busy", 503)) is Outcome.NOT_STORED
    assert outcome(TopicNotFoundError("TOPIC_NOT_FOUND", "no", 404)) is Outcome.NOT_STORED
    assert outcome(InternalServerError("INTERNAL_ERROR", "bug", 500)) is Outcome.MAYBE_STORED
    assert outcome(BadRequestError("BAD_REQUEST", "no", 400)) is Outcome.FINAL


POLICY = RetryPolicy(max_attempts=6, initial_backoff_s=0.001, max_backoff_s=0.002)


async def test_a_lost_answer_keeps_to_its_live_group_for_the_stick_window_then_moves() -> None:
    groups = {"a", "b"}
    attempts = SendAttempts(health(FakeClock()), POLICY, movable=True, first="a", what="m")
    assert await attempts.after_failure(TransportError("reset"), "a", groups) is Step.SAME
    # timed out again: "a" is alive and may hold the message, so the retry stays there (after a
    # pause) instead of storing a second copy on "b"
    assert await attempts.after_failure(RequestTimeoutError("slow"), "a", groups) is Step.SAME
    assert not attempts.duplicated_on("a")
    # past the stick window it moves: the one case where "b" may store a second copy
    late = SendAttempts(health(FakeClock()), POLICY, movable=True, first="a", what="m",
                        started=time.monotonic() - MAYBE_STORED_STICK_S)
    assert await late.after_failure(TransportError("reset"), "a", groups) is Step.SAME
    assert await late.after_failure(RequestTimeoutError("slow"), "a", groups) is Step.SELECT
    assert late.tried == {"a"}
    assert late.duplicated_on("b") and not late.duplicated_on("a")


async def test_a_group_that_stops_taking_connections_is_left_at_once() -> None:
    attempts = SendAttempts(health(FakeClock()), POLICY, movable=True, first="a", what="m")
    assert await attempts.after_failure(TransportError("reset"), "a", {"a", "b"}) is Step.SAME
    refused = TransportError("refused", sent=False)  # killed: availability first
    assert await attempts.after_failure(refused, "a", {"a", "b"}) is Step.SELECT
    assert attempts.duplicated_on("b")  # the residual risk, counted


async def test_a_replicated_group_that_may_hold_the_send_is_waited_for_not_left() -> None:
    """Its primary killed after reading the send: the successor holds the copy (or it was never
    acknowledged and is gone), so the send waits for it instead of storing a second copy on
    another group (the faults suite's open finding 1); past the stick window it moves."""
    attempts = SendAttempts(health(FakeClock()), POLICY, movable=True, first="a", what="m")
    refused = TransportError("refused", sent=False)
    assert await attempts.after_failure(TransportError("reset"), "a", {"a", "b"},
                                        replicated=True) is Step.SAME
    assert await attempts.after_failure(refused, "a", {"a", "b"}, replicated=True) is Step.SAME
    assert not attempts.duplicated_on("a")
    late = SendAttempts(health(FakeClock()), POLICY, movable=True, first="a", what="m",
                        started=time.monotonic() - MAYBE_STORED_STICK_S)
    assert await late.after_failure(TransportError("reset"), "a", {"a", "b"},
                                    replicated=True) is Step.SAME
    assert await late.after_failure(refused, "a", {"a", "b"}, replicated=True) is Step.SELECT
    assert late.duplicated_on("b")


async def test_not_enough_replicas_may_have_stored_so_the_send_keeps_to_its_group() -> None:
    """The primary wrote it, its replicas did not confirm (a partition): the copy becomes
    visible once they catch up, so the retry stays with the group (its dedup meets it) instead
    of storing a second copy elsewhere (seen by the faults suite's bridge partition)."""
    lagging = NotEnoughReplicasError("NOT_ENOUGH_REPLICAS", "1 of 2 in sync", 503)
    assert outcome(lagging) is Outcome.MAYBE_STORED
    attempts = SendAttempts(health(FakeClock()), POLICY, movable=True, first="a", what="m")
    assert await attempts.after_failure(lagging, "a", {"a", "b"}, replicated=True) is Step.SAME
    assert await attempts.after_failure(lagging, "a", {"a", "b"}, replicated=True) is Step.SAME
    assert not attempts.duplicated_on("a")


async def test_not_primary_may_have_stored_so_the_send_keeps_to_its_group() -> None:
    """The primary wrote the batch, then its fence shut before the replicas confirmed it (a
    lease renewal late under packet loss) and the gate answered NOT_PRIMARY; the primary kept
    its lease and the copy became visible. Moving to another group stored it twice (12-message
    SDK batches in the faults suite's lossy-link fault, open finding 1): the send keeps to its
    group, following the successor, and counts no copy elsewhere."""
    deposed = NotPrimaryError("NOT_PRIMARY", "this broker no longer holds the primary's lease",
                              503)
    assert outcome(deposed) is Outcome.MAYBE_STORED
    attempts = SendAttempts(health(FakeClock()), POLICY, movable=True, first="a", what="m")
    assert await attempts.after_failure(deposed, "a", {"a", "b"}, replicated=True) is Step.SAME
    assert await attempts.after_failure(deposed, "a", {"a", "b"}, replicated=True) is Step.SAME
    assert not attempts.duplicated_on("a")


async def test_not_stored_moves_at_once_and_no_copy_is_counted() -> None:
    attempts = SendAttempts(health(FakeClock()), POLICY, movable=True, first="a", what="m")
    busy = BrokerBusyError("BROKER_BUSY", "busy", 503)
    assert await attempts.after_failure(busy, "a", {"a", "b"}) is Step.SELECT
    assert not attempts.duplicated_on("b")


async def test_a_pinned_send_stays_and_gives_up_after_max_attempts() -> None:
    h = health(FakeClock())
    attempts = SendAttempts(h, RetryPolicy(max_attempts=3, initial_backoff_s=0.001), first="a",
                            movable=False, what="m")
    refused = TransportError("refused", sent=False)
    assert await attempts.after_failure(refused, "a", {"a", "b"}) is Step.SELECT
    assert attempts.tried == set()  # paused and started over: the same queue is selected again
    assert await attempts.after_failure(refused, "a", {"a", "b"}) is Step.SELECT
    with pytest.raises(TransportError):
        await attempts.after_failure(refused, "a", {"a", "b"})
    with pytest.raises(BadRequestError):
        await SendAttempts(h, POLICY, movable=True, first="a", what="m").after_failure(
            BadRequestError("BAD_REQUEST", "no", 400), "a", {"a", "b"})


ROUTE = TopicRoute("t", (BrokerRoute("a", "http://a", 2), BrokerRoute("b", "http://b", 2)))


def test_round_robin_skips_a_backing_off_group_and_probes_it_later() -> None:
    clock = FakeClock()
    h = health(clock)
    selector = QueueSelector()
    h.failed("b")
    assert {selector.select(ROUTE, health=h).broker_name for _ in range(8)} == {"a"}
    # a send that failed on "a" has nowhere else to go: "b" is tried although it backs off
    assert selector.select(ROUTE, health=h, avoid={"a"}).broker_name == "b"
    clock.now += 2.0  # past the back-off and that request's probe time
    chosen = [selector.select(ROUTE, health=h).broker_name for _ in range(4)]
    assert chosen.count("b") == 1  # exactly one probe while it is out


def test_a_sharding_key_keeps_its_queue_unless_resharding_is_allowed() -> None:
    h = health(FakeClock())
    selector = QueueSelector()
    key = next(k for k in (f"k{i}" for i in range(100))
               if selector.select(ROUTE, sharding_key=k).broker_name == "b")
    h.failed("b")
    assert selector.select(ROUTE, sharding_key=key, health=h).broker_name == "b"
    moved = selector.select(ROUTE, sharding_key=key, health=h, reshard=True)
    assert moved.broker_name == "a"
    assert moved == selector.select(ROUTE, sharding_key=key, health=h, reshard=True)
