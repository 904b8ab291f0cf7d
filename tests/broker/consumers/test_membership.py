"""Group membership: heartbeats, leave, expiry on a fake clock, the expiry loop."""

from __future__ import annotations

import asyncio
import logging

import pytest
from tidemq.protocol import ErrorCode, ProtocolError

from tests.support.clock import FakeClock
from tidemq_server.broker.consumers.membership import (
    GroupExpiryLoop,
    GroupRegistry,
    ProducerRegistry,
)


def test_heartbeat_returns_sorted_members(clock: FakeClock) -> None:
    reg = GroupRegistry(expiry_s=30, clock=clock)
    assert reg.heartbeat("G", "c2", {"T": "*"}, "clustering") == ["c2"]
    assert reg.heartbeat("G", "c1", {"T": "*"}, "clustering") == ["c1", "c2"]
    assert reg.heartbeat("G", "c2", {"T": "*"}, "clustering") == ["c1", "c2"]
    assert reg.members("G") == ["c1", "c2"]
    assert reg.members("other") == []
    assert reg.groups() == ["G"]
    assert reg.mode("G") == "clustering"
    assert reg.mode("other") is None


def test_leave_drops_member_now(clock: FakeClock) -> None:
    reg = GroupRegistry(clock=clock)
    reg.heartbeat("G", "c1", {}, "clustering")
    reg.heartbeat("G", "c2", {}, "clustering")
    assert reg.leave("G", "c1") is True
    assert reg.leave("G", "c1") is False
    assert reg.members("G") == ["c2"]
    assert reg.leave("G", "c2") is True
    assert reg.groups() == []
    assert reg.leave("nope", "c1") is False


def test_silent_member_hidden_then_expired(clock: FakeClock) -> None:
    reg = GroupRegistry(expiry_s=30, clock=clock)
    reg.heartbeat("G", "old", {"T": "*"}, "clustering")
    clock.now += 20
    reg.heartbeat("G", "new", {"T": "*"}, "clustering")
    clock.now += 10.5  # "old" silent 30.5 s, "new" 10.5 s
    assert reg.members("G") == ["new"]  # hidden before the loop runs
    assert reg.heartbeat("G", "new", {"T": "*"}, "clustering") == ["new"]
    assert reg.expire() == [("G", "old")]
    assert reg.expire() == []
    clock.now += 31
    assert reg.expire() == [("G", "new")]
    assert reg.groups() == []


def test_subscriptions_are_merged(clock: FakeClock) -> None:
    reg = GroupRegistry(clock=clock)
    reg.heartbeat("G", "c1", {"A": "x || y", "B": "t"}, "clustering")
    reg.heartbeat("G", "c2", {"A": "z", "B": "*", "C": "k"}, "clustering")
    assert reg.subscriptions("G") == {"A": "x || y || z", "B": "*", "C": "k"}
    reg.heartbeat("G", "c2", {"C": "k"}, "clustering")  # a member changes its subscriptions
    assert reg.subscriptions("G") == {"A": "x || y", "B": "t", "C": "k"}
    assert reg.subscriptions("unknown") == {}


def test_mode_follows_latest_heartbeat_and_is_validated(clock: FakeClock) -> None:
    reg = GroupRegistry(clock=clock)
    reg.heartbeat("G", "c1", {}, "clustering")
    clock.now += 1
    reg.heartbeat("G", "c2", {}, "broadcasting")
    assert reg.mode("G") == "broadcasting"
    with pytest.raises(ProtocolError) as err:
        reg.heartbeat("G", "c3", {}, "sideways")
    assert err.value.code is ErrorCode.BAD_REQUEST
    assert "c3" not in reg.members("G")
    with pytest.raises(ProtocolError):
        reg.heartbeat("G", "", {}, "clustering")


def test_producer_registry(clock: FakeClock) -> None:
    reg = ProducerRegistry(expiry_s=30, clock=clock)
    assert reg.heartbeat("P", "p2") == ["p2"]
    assert reg.heartbeat("P", "p1") == ["p1", "p2"]
    assert reg.live("P") == ["p1", "p2"] and reg.is_live("P", "p1")
    clock.now += 25
    reg.heartbeat("P", "p1")
    clock.now += 10
    assert reg.live("P") == ["p1"] and not reg.is_live("P", "p2")
    assert reg.expire() == [("P", "p2")]
    assert reg.leave("P", "p1") and reg.live("P") == [] and reg.groups() == []


async def test_expiry_loop_drops_and_logs(clock: FakeClock, caplog: pytest.LogCaptureFixture,
                                          ) -> None:
    reg = GroupRegistry(expiry_s=30, clock=clock)
    reg.heartbeat("G", "c1", {}, "clustering")
    reg.heartbeat("G", "c2", {}, "clustering")
    clock.now += 31
    reg.heartbeat("G", "c2", {}, "clustering")
    loop = GroupExpiryLoop(reg, interval_s=0.01)
    with caplog.at_level(logging.INFO, logger="tidemq_server.broker.consumers.membership"):
        await loop.run_once()
    assert reg.members("G") == ["c2"]
    assert any("c1" in r.getMessage() and "dropped" in r.getMessage() for r in caplog.records)


async def test_expiry_loop_runs_in_background(clock: FakeClock) -> None:
    reg = ProducerRegistry(expiry_s=30, clock=clock)
    reg.heartbeat("P", "p1")
    clock.now += 31
    loop = GroupExpiryLoop(reg, interval_s=0.01)
    loop.start()
    try:
        await asyncio.sleep(0.1)
        assert reg.expire() == []  # the loop already dropped p1
    finally:
        await loop.stop()
