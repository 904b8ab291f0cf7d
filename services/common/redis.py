"""The Redis connection every service makes (consumer offsets, checker and scheduler progress)."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

REDIS_TIMEOUT_S = 2.0  # socket connect/read timeout: a dead Redis is reported within this (s)


def connect_redis(url: str, timeout_s: float = REDIS_TIMEOUT_S) -> Redis:
    """A client that fails fast when Redis is down and reconnects by itself when it is back.

    One immediate retry on a connection error covers a pooled connection that died with a Redis
    restart; timeouts are not retried, so a hung Redis costs one ``timeout_s``.
    """
    return Redis.from_url(
        url, decode_responses=True, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        health_check_interval=30,
    )


def text(value: Any) -> str:
    """A Redis reply as str, whichever ``decode_responses`` the client was made with."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
