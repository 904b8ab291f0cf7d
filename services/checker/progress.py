"""The checker's progress in Redis: next half-queue offset to scan, next op-queue offset to read.

Saved in one ``HSET`` after every page, so a killed checker repeats at most the page it was in
(and the broker refuses to act twice on a half copy it has already re-put: see tx_checking.py).
"""

from __future__ import annotations

from redis.asyncio import Redis
from redis.exceptions import RedisError

from services.common.constants import checker_progress_key
from services.common.redis import connect_redis


class ProgressUnavailable(Exception):
    """Redis did not answer: the scan stops and starts again from the last saved progress."""


class ProgressStore:
    def __init__(self, redis: Redis | str, cluster: str) -> None:
        self.redis = connect_redis(redis) if isinstance(redis, str) else redis
        self.cluster = cluster
        self.key = ""

    def bind(self, broker_name: str) -> None:
        self.key = checker_progress_key(self.cluster, broker_name)

    async def load(self) -> tuple[int, int]:
        """(half offset, op offset); (0, 0) for a checker that never ran against this broker."""
        try:
            raw = await self.redis.hgetall(self.key)
        except RedisError as exc:
            raise ProgressUnavailable(f"reading {self.key}: {exc}") from exc
        return int(raw.get("half", 0)), int(raw.get("op", 0))

    async def save(self, half: int, op: int) -> None:
        try:
            await self.redis.hset(self.key, mapping={"half": half, "op": op})
        except RedisError as exc:
            raise ProgressUnavailable(f"writing {self.key}: {exc}") from exc

    async def close(self) -> None:
        await self.redis.aclose()
