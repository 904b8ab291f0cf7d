"""The Redis connection every service makes (consumer offsets, checker and scheduler progress).

Two kinds of URL name the Redis:

- ``redis://[[user]:password@]host:port/db`` (and ``rediss://``, ``unix://``): one server, as
  redis-py reads it. A dead Redis is reported within ``REDIS_TIMEOUT_S``; one immediate retry
  covers a pooled connection that died with a Redis restart.
- ``redis+sentinel://[[user]:password@]host1:26379,host2:26379/master-name[/db]`` with optional
  query ``?sentinel_password=...&failover_wait_s=...``: a Sentinel-managed Redis. The sentinels
  (port 26379 when left out) are asked for the current master of ``master-name`` whenever a
  connection is made; the userinfo authenticates to the master and replicas, ``sentinel_password``
  to the sentinels. A connection error or a ``READONLY`` reply (the old master came back as a
  replica) makes the client ask the sentinels again and retry with a capped exponential backoff
  for up to ``failover_wait_s`` (``REDIS_FAILOVER_WAIT_S``), so a request in flight during a
  failover waits for the new master instead of failing, and fails cleanly past that bound.
"""

from __future__ import annotations

import time
from asyncio import sleep
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel, SentinelManagedConnection
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from tidemq_server.common.constants import (
    REDIS_FAILOVER_BACKOFF_MAX_S,
    REDIS_FAILOVER_BACKOFF_MIN_S,
    REDIS_FAILOVER_WAIT_S,
    REDIS_SENTINEL_PORT,
)

REDIS_TIMEOUT_S = 2.0  # socket connect/read timeout: a dead Redis is reported within this (s)
SENTINEL_SCHEME = "redis+sentinel"

T = TypeVar("T")


class NotReplicated(RedisError):
    """A write reached the master but not the replicas asked for within the wait timeout."""


@dataclass(frozen=True, slots=True)
class SentinelTarget:
    """What a ``redis+sentinel://`` URL names."""

    sentinels: tuple[tuple[str, int], ...]  # (host, port) of each sentinel
    master: str  # the name the sentinels monitor the master under
    db: int = 0
    username: str | None = None  # for the master and replicas
    password: str | None = None
    sentinel_password: str | None = None
    failover_wait_s: float = REDIS_FAILOVER_WAIT_S


def is_sentinel_url(url: str) -> bool:
    return url.split("://", 1)[0].lower() == SENTINEL_SCHEME


def parse_sentinel_url(url: str) -> SentinelTarget:
    """Read a ``redis+sentinel://`` URL; ``ValueError`` names what is wrong."""
    parts = urlsplit(url)
    if parts.scheme.lower() != SENTINEL_SCHEME:
        raise ValueError(f"{url!r}: not a {SENTINEL_SCHEME}:// URL")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username = password = None
    if userinfo:
        user, sep, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if sep else None
    sentinels = tuple(_host_port(item, url) for item in hosts.split(",") if item.strip())
    if not sentinels:
        raise ValueError(f"{url!r}: no sentinel host (expected "
                         f"{SENTINEL_SCHEME}://host1:26379,host2:26379/master-name/0)")
    path = [unquote(p) for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise ValueError(f"{url!r}: the path must be /master-name or /master-name/db")
    db = 0
    if len(path) == 2:
        if not path[1].isdigit():
            raise ValueError(f"{url!r}: database {path[1]!r} is not a number")
        db = int(path[1])
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    unknown = set(query) - {"sentinel_password", "failover_wait_s"}
    if unknown:
        raise ValueError(f"{url!r}: unknown option(s) {', '.join(sorted(unknown))} (known: "
                         "sentinel_password, failover_wait_s)")
    wait = REDIS_FAILOVER_WAIT_S
    if "failover_wait_s" in query:
        try:
            wait = float(query["failover_wait_s"])
        except ValueError:
            wait = -1.0
        if not wait >= 0:
            raise ValueError(f"{url!r}: failover_wait_s must be a number of seconds >= 0")
    return SentinelTarget(sentinels, path[0], db, username, password,
                          query.get("sentinel_password") or None, wait)


def validate_redis_url(url: str) -> str:
    """A settings validator: a ``redis+sentinel://`` URL must parse (``ValueError`` says why)."""
    if is_sentinel_url(url):
        parse_sentinel_url(url)
    return url


def _host_port(item: str, url: str) -> tuple[str, int]:
    item = item.strip()
    if item.startswith("["):  # [::1]:26379
        host, _, rest = item[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port = item.partition(":")
    if not host:
        raise ValueError(f"{url!r}: empty sentinel host in {item!r}")
    if not port:
        return host, REDIS_SENTINEL_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{url!r}: bad sentinel port in {item!r}")
    return host, int(port)


class FailoverRetry(Retry):
    """Retry connection errors with a capped exponential backoff until ``budget_s`` has passed
    since the first failure of one call (a bound in time, not in attempts: redis-py nests the
    connect retry inside the command retry, and both stop at the same time)."""

    def __init__(self, budget_s: float) -> None:
        super().__init__(NoBackoff(), 1_000_000, supported_errors=(RedisConnectionError,))
        self.budget_s = budget_s

    async def call_with_retry(self, do: Callable[[], Awaitable[T]],
                              fail: Callable[..., Any],
                              is_retryable: Callable[[Exception], bool] | None = None,
                              with_failure_count: bool = False) -> T:
        deadline: float | None = None
        failures = 0
        while True:
            try:
                return await do()
            except self._supported_errors as error:
                if is_retryable is not None and not is_retryable(error):
                    raise
                failures += 1
                await (fail(error, failures) if with_failure_count else fail(error))
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.budget_s
                if now >= deadline:
                    raise
                pause = min(REDIS_FAILOVER_BACKOFF_MAX_S,
                            REDIS_FAILOVER_BACKOFF_MIN_S * 2 ** (failures - 1))
                await sleep(min(pause, deadline - now))


class MasterConnection(SentinelManagedConnection):
    """A connection to the master the sentinels name, on every (re)connect.

    redis-py reconnects a dropped connection on its next send through ``connect_check_health``,
    which dials the address the connection had: after a failover, the dead master again until
    the retries run out. Here that path asks the sentinels first, as ``connect`` does.
    """

    async def connect_check_health(self, check_health: bool = True,
                                   retry_socket_connect: bool = True) -> None:
        if not self.is_connected and retry_socket_connect:  # not from connect_to: resolve
            await self.connect()
            return
        await super().connect_check_health(check_health, retry_socket_connect)


class Sentinels(Sentinel):
    """redis-py's sentinel manager, with a short error when no sentinel names a master."""

    def __init__(self, addresses: list[tuple[str, int]], **kwargs: Any) -> None:
        super().__init__(addresses, **kwargs)
        self.addresses = ",".join(f"{host}:{port}" for host, port in addresses)

    async def discover_master(self, service_name: str) -> Any:
        try:
            return await super().discover_master(service_name)
        except MasterNotFoundError:
            raise MasterNotFoundError(
                f"no master for {service_name!r}: the sentinels at {self.addresses} name no "
                "healthy one (a failover in progress, or no sentinel reachable)") from None


class SentinelRedis(Redis):
    """A client of the current master; closing it closes its sentinel clients too."""

    sentinels: Sentinels | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        if self.sentinels is not None:  # each sentinel is a plain client (Sentinel.aclose is
            for sentinel in self.sentinels.sentinels:  # redis-py 8.1's, newer than the floor)
                await sentinel.aclose()


def connect_redis(url: str, timeout_s: float = REDIS_TIMEOUT_S) -> Redis:
    """A client that fails fast when Redis is down and reconnects by itself when it is back.

    ``redis://``: one immediate retry on a connection error covers a pooled connection that died
    with a Redis restart; timeouts are not retried, so a hung Redis costs one ``timeout_s``.
    ``redis+sentinel://``: connection errors and READONLY replies are retried against the master
    the sentinels name, for up to the URL's ``failover_wait_s``.
    """
    if is_sentinel_url(url):
        return _connect_sentinel(parse_sentinel_url(url), timeout_s)
    return Redis.from_url(
        url, decode_responses=True, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        health_check_interval=30,
    )


def _connect_sentinel(target: SentinelTarget, timeout_s: float) -> Redis:
    # A sentinel that does not answer is passed over at once (the next one is asked): no
    # retries of its own, the master connection's retry paces the rounds.
    sentinel_kwargs: dict[str, Any] = {"socket_timeout": timeout_s,
                                       "socket_connect_timeout": timeout_s,
                                       "decode_responses": True,
                                       "retry": Retry(NoBackoff(), 0)}
    if target.sentinel_password:
        sentinel_kwargs["password"] = target.sentinel_password
    sentinel = Sentinels(list(target.sentinels), sentinel_kwargs=sentinel_kwargs)
    client = sentinel.master_for(
        target.master, redis_class=SentinelRedis, connection_class=MasterConnection,
        db=target.db, username=target.username,
        password=target.password, decode_responses=True, socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s, retry=FailoverRetry(target.failover_wait_s),
        health_check_interval=30)
    assert isinstance(client, SentinelRedis)
    client.sentinels = sentinel
    return client


def text(value: Any) -> str:
    """A Redis reply as str, whichever ``decode_responses`` the client was made with."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
