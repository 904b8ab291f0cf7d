"""Redis URLs: ``redis+sentinel://`` parsing and errors, and which client each kind makes."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
from pydantic import ValidationError
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from tests.support.clock import FakeClock
from tests.support.wait import HANG_S
from tidemq_server.broker.settings import BrokerSettings
from tidemq_server.checker.settings import CheckerSettings
from tidemq_server.common import redis as redis_module
from tidemq_server.common.constants import REDIS_FAILOVER_WAIT_S, REDIS_SENTINEL_PORT
from tidemq_server.common.redis import (
    FailoverRetry,
    MasterConnection,
    SentinelRedis,
    SentinelTarget,
    connect_redis,
    is_sentinel_url,
    parse_sentinel_url,
)
from tidemq_server.scheduler.settings import SchedulerSettings


def test_full_url() -> None:
    target = parse_sentinel_url("redis+sentinel://app:s%40cret@10.0.0.1:26380,h2,[::1]:26381"
                                "/mymaster/3?sentinel_password=sp&failover_wait_s=2.5")
    assert target == SentinelTarget(
        sentinels=(("10.0.0.1", 26380), ("h2", REDIS_SENTINEL_PORT), ("::1", 26381)),
        master="mymaster", db=3, username="app", password="s@cret", sentinel_password="sp",
        failover_wait_s=2.5)


def test_defaults() -> None:
    target = parse_sentinel_url("REDIS+SENTINEL://h1:1,h2:2/m")
    assert target.db == 0 and target.username is None and target.password is None
    assert target.sentinel_password is None and target.failover_wait_s == REDIS_FAILOVER_WAIT_S
    assert parse_sentinel_url("redis+sentinel://:pw@h/m").password == "pw"


@pytest.mark.parametrize(("url", "says"), [
    ("redis+sentinel:///mymaster/0", "no sentinel host"),
    ("redis+sentinel://h1:26379", "the path must be /master-name"),
    ("redis+sentinel://h1/m/0/extra", "the path must be /master-name"),
    ("redis+sentinel://h1/m/zero", "database 'zero' is not a number"),
    ("redis+sentinel://h1:port/m", "bad sentinel port"),
    ("redis+sentinel://h1:70000/m", "bad sentinel port"),
    ("redis+sentinel://h1,:5/m", "empty sentinel host"),
    ("redis+sentinel://h1/m?timeout=3", "unknown option(s) timeout"),
    ("redis+sentinel://h1/m?failover_wait_s=-1", "failover_wait_s must be"),
    ("redis+sentinel://h1/m?failover_wait_s=soon", "failover_wait_s must be"),
    ("redis://h1/0", "not a redis+sentinel:// URL"),
])
def test_bad_urls_say_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_sentinel_url(url)
    assert says in str(err.value)


@pytest.mark.parametrize("settings", [BrokerSettings, CheckerSettings, SchedulerSettings])
def test_settings_refuse_a_bad_sentinel_url(settings: type[BrokerSettings]) -> None:
    with pytest.raises(ValidationError) as err:
        settings(redis_url="redis+sentinel://h1:26379")
    assert "master-name" in str(err.value)
    ok = settings(redis_url="redis+sentinel://h1,h2/m/1")
    assert ok.redis_url == "redis+sentinel://h1,h2/m/1"


async def test_plain_url_makes_a_plain_client() -> None:
    assert not is_sentinel_url("redis://127.0.0.1:6379/0")
    client = connect_redis("redis://127.0.0.1:6379/2")
    try:
        assert type(client) is Redis
        kwargs = client.connection_pool.connection_kwargs
        assert kwargs["db"] == 2 and kwargs["retry"].get_retries() == 1
    finally:
        await client.aclose()


async def test_sentinel_url_makes_a_master_client() -> None:
    client = connect_redis("redis+sentinel://127.0.0.1:1,127.0.0.1:2/m/4?failover_wait_s=3")
    try:
        assert isinstance(client, SentinelRedis) and client.sentinels is not None
        assert len(client.sentinels.sentinels) == 2
        pool = client.connection_pool
        assert pool.connection_class is MasterConnection
        assert pool.connection_kwargs["db"] == 4
        retry = pool.connection_kwargs["retry"]
        assert isinstance(retry, FailoverRetry) and retry.budget_s == 3
    finally:
        await client.aclose()


async def test_failover_retry_gives_up_once_its_budget_is_spent(
        monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> None:
    """On a clock the test moves: back-offs double from the first failure, the last one is cut
    to the budget, and the first failure past it is raised."""
    pauses: list[float] = []

    async def pause(seconds: float) -> None:
        pauses.append(round(seconds, 6))
        clock.advance(seconds)

    monkeypatch.setattr(redis_module, "time", SimpleNamespace(monotonic=clock))
    monkeypatch.setattr(redis_module, "sleep", pause)
    attempts = 0

    async def down() -> None:
        nonlocal attempts
        attempts += 1
        raise RedisConnectionError("refused")

    async def failed(error: Exception) -> None:
        pass

    with pytest.raises(RedisConnectionError):
        await FailoverRetry(budget_s=2.0).call_with_retry(down, failed)
    assert pauses[:7] == [0.05, 0.1, 0.2, 0.4, 0.5, 0.5, 0.25]  # capped; the last one cut
    assert sum(pauses) == pytest.approx(2.0)  # (a float step may add a vanishing one)
    assert attempts == len(pauses) + 1


async def test_failover_retry_is_bounded_in_time() -> None:
    """No sentinel answers: a command fails once the failover wait is spent, not before."""
    client = connect_redis("redis+sentinel://127.0.0.1:1/m?failover_wait_s=0.6")
    started = time.monotonic()
    try:
        with pytest.raises(RedisConnectionError) as err:
            async with asyncio.timeout(HANG_S):  # bounded: it gives up (a hang fails here)
                await client.ping()
    finally:
        await client.aclose()
    assert time.monotonic() - started >= 0.55  # not before the failover wait is spent
    assert "no master for 'm': the sentinels at 127.0.0.1:1 name no healthy one" in str(err.value)
