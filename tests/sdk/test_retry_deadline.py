"""The retry policy's defaults (issue 32): one deadline binds, not a count of attempts; the pause
is capped at about a second with jitter; a give-up says how long it tried and the last cause.
Over the SDK's own ``MockTransport``, with the client's sleep and clock driven by the test."""

from __future__ import annotations

from typing import Any

import pytest
from tidemq import (
    BadRequestError,
    ConfigurationError,
    MockTransport,
    NotPrimaryError,
    Producer,
    RetryPolicy,
    TransportError,
    TransportRequest,
    TransportResponse,
    UnavailableError,
)
from tidemq._constants import RETRY_DEADLINE_S, RETRY_MAX_BACKOFF_S
from tidemq._exceptions import WireConnectError
from tidemq._fault import primary_hint
from tidemq._http import DEFAULT_RETRY, NO_RETRY, HttpClient, gave_up
from tidemq._routes import BrokerRoute, RouteTable, TopicRoute, _Cached

TARGET = "http://broker:1/v1/x"


class Clock:
    """The client's clock and sleep: a sleep moves the clock."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def client(transport: MockTransport, policy: RetryPolicy = DEFAULT_RETRY,
           clock: Clock | None = None) -> tuple[HttpClient, Clock]:
    http = HttpClient(transport=transport, retry=policy)
    clock = clock or Clock()
    http._clock = clock
    http._sleep = clock.sleep
    return http, clock


def down_for(seconds: float, clock: Clock) -> MockTransport:
    """A broker refusing connections (a restart) for ``seconds`` of the clock, then answering."""
    back_at = clock.now + seconds

    def handle(request: TransportRequest) -> TransportResponse:
        if clock.now < back_at:
            raise WireConnectError("connection refused")
        return TransportResponse.encoded(200, {"ok": True})
    return MockTransport(handle)


async def test_a_restart_longer_than_six_attempts_is_ridden_through_by_default() -> None:
    clock = Clock()
    transport = down_for(8.0, clock)  # longer than the ~1.5 s the old 6 attempts covered
    http, _ = client(transport, clock=clock)
    assert await http.call("GET", TARGET) == {"ok": True}
    assert len(transport.requests) > 6  # the old max_attempts=6 would have raised
    assert clock.now - 1000.0 >= 8.0


async def test_the_deadline_binds_and_the_error_says_how_long_and_why() -> None:
    def unavailable(request: TransportRequest) -> TransportResponse:
        return TransportResponse.encoded(503, {"code": "UNAVAILABLE", "message": "redis down"})

    transport = MockTransport(unavailable)
    http, clock = client(transport)
    with pytest.raises(UnavailableError) as failed:
        await http.call("GET", TARGET)
    elapsed = clock.now - 1000.0
    assert RETRY_DEADLINE_S - RETRY_MAX_BACKOFF_S <= elapsed <= RETRY_DEADLINE_S
    assert failed.value.attempts == len(transport.requests) > 6
    assert failed.value.elapsed_s == pytest.approx(elapsed)
    text = str(failed.value)
    assert "redis down" in text  # the last cause
    assert f"after {failed.value.attempts} attempts in {elapsed:.1f}s" in text
    assert f"retry deadline {RETRY_DEADLINE_S:g}s" in text


async def test_a_non_retriable_answer_is_raised_at_once_and_says_so_after_retries() -> None:
    answers = [TransportResponse.encoded(503, {"code": "BROKER_BUSY", "message": "busy"}),
               TransportResponse.encoded(400, {"code": "BAD_REQUEST", "message": "no"})]
    http, _ = client(MockTransport(lambda r: answers.pop(0)))
    with pytest.raises(BadRequestError) as failed:
        await http.call("GET", TARGET)
    assert failed.value.attempts == 2 and "not retriable" in str(failed.value)
    http, _ = client(MockTransport(lambda r: TransportResponse.encoded(
        400, {"code": "BAD_REQUEST", "message": "no"})))
    with pytest.raises(BadRequestError) as first:
        await http.call("GET", TARGET)
    assert first.value.attempts == 1 and str(first.value) == "BAD_REQUEST: no (HTTP 400)"


async def test_max_attempts_still_bounds_when_given() -> None:
    def refused(request: TransportRequest) -> TransportResponse:
        raise WireConnectError("connection refused")

    transport = MockTransport(refused)
    http, _ = client(transport, RetryPolicy(max_attempts=3))
    with pytest.raises(TransportError, match="max_attempts=3"):
        await http.call("GET", TARGET)
    assert len(transport.requests) == 3


def test_backoff_is_capped_at_about_a_second_with_jitter_within_bounds() -> None:
    policy = DEFAULT_RETRY
    assert policy.max_attempts is None and policy.deadline_s == RETRY_DEADLINE_S
    assert policy.max_backoff_s == RETRY_MAX_BACKOFF_S <= 1.0
    for attempt in (1, 2, 5, 6, 50, 5000):  # no overflow however many attempts
        base = min(policy.max_backoff_s, policy.initial_backoff_s * 2 ** min(attempt - 1, 64))
        pauses = [policy.backoff_s(attempt) for _ in range(200)]
        assert all(base * (1 - policy.jitter) <= p <= base for p in pauses)
        assert len(set(pauses)) > 1  # jittered: clients that failed together spread out
    assert policy.backoff_s(3, retry_after=4.0) == 4.0  # a server's Retry-After wins
    assert RetryPolicy(max_attempts=None, deadline_s=None).exhausted(10**6, 1e9, 1.0) is None


@pytest.mark.parametrize("bad", [{"max_attempts": 0}, {"jitter": 1.5}, {"deadline_s": -1.0},
                                 {"max_backoff_s": -1.0}, {"multiplier": 0.5}])
def test_a_bad_policy_is_a_configuration_error_naming_the_field(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match=next(iter(bad))):
        RetryPolicy(**bad)


def test_gave_up_annotates_once() -> None:
    exc = TransportError("POST x: refused")
    assert str(gave_up(exc, 1, 0.0)) == "POST x: refused"  # one attempt: nothing to add
    gave_up(exc, 4, 2.25, "retry deadline 2s")
    gave_up(exc, 9, 9.0, "outer")  # an outer loop does not say it again
    assert str(exc) == "POST x: refused (after 4 attempts in 2.2s; gave up: retry deadline 2s)"


def test_a_not_primary_hint_is_read_and_followed_only_to_a_known_address() -> None:
    hinted = NotPrimaryError("NOT_PRIMARY", "this broker is a replica (epoch 3); the primary "
                             "is http://10.0.0.2:10911", 503)
    assert primary_hint(hinted) == "http://10.0.0.2:10911"
    assert primary_hint(NotPrimaryError("NOT_PRIMARY", "this broker is a replica (epoch 3); "
                                        "the primary is unknown", 503)) is None
    assert primary_hint(UnavailableError("UNAVAILABLE", "the primary is http://x", 503)) is None

    table = RouteTable(HttpClient(transport=MockTransport(lambda r: TransportResponse.encoded(
        200))), nameservers=["http://ns:1"])
    route = TopicRoute("t", (BrokerRoute("g", "http://10.0.0.1:10911", 2, "rw",
                                         ("http://10.0.0.2:10911",)),))
    table._cache["t"] = _Cached(route, 0.0)
    assert not table.follow_primary("t", "g", "http://elsewhere:1")  # not a known address
    assert table.follow_primary("t", "g", "http://10.0.0.2:10911")
    moved = table.cached("t")
    assert moved is not None
    (group,) = moved.brokers
    assert group.address == "http://10.0.0.2:10911" and group.writable
    assert group.replicas == ("http://10.0.0.1:10911",)
    assert moved.writable_queue("g", 1) is not None
    assert not table.follow_primary("t", "g", "http://10.0.0.2:10911")  # already there


async def test_retry_call_asks_for_the_route_again_and_rides_a_restart() -> None:
    """``Client._retry_call``, the wrapper of idempotent non-send calls (a cancel): a broker
    that refuses twice is asked again, the route looked up again after each refusal."""
    route_asks = 0
    refusals = 2

    def handle(request: TransportRequest) -> TransportResponse:
        nonlocal route_asks, refusals
        if request.url.startswith("http://ns:1/v1/routes/"):
            route_asks += 1
            return TransportResponse.encoded(200, {"topic": "t", "queues": [
                {"broker_name": "g", "address": "http://b:1", "queues": 1}]})
        if refusals:
            refusals -= 1
            raise WireConnectError("connection refused")
        if request.method == "DELETE":
            return TransportResponse.encoded(200, {"state": "cancelled"})
        return TransportResponse.encoded(400, {"code": "BAD_REQUEST", "message": "no"})

    policy = RetryPolicy(initial_backoff_s=0.001, max_backoff_s=0.002)
    async with Producer(nameservers=["http://ns:1"], transport=MockTransport(handle),
                        retry=policy) as p:
        async def cancel(route: TopicRoute) -> Any:
            return await p._http.call("DELETE", route.addresses[0] + "/v1/messages/m/schedule",
                                      retry=NO_RETRY)

        assert await p._retry_call("t", cancel, what="cancel m") == {"state": "cancelled"}
        assert route_asks == 3  # the first lookup, then one after each refusal

        async def bad(route: TopicRoute) -> Any:
            return await p._http.call("GET", route.addresses[0] + "/v1/x", retry=NO_RETRY)

        with pytest.raises(BadRequestError):
            await p._retry_call("t", bad, what="bad")
