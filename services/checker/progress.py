"""The checker's progress in Redis: next half-queue offset to scan, next op-queue offset to read,
and the op-queue offset the ended ids it holds were read from (``op_from``: a restarted checker
reads them again).

Saved in one ``HSET`` after every page, so a killed checker repeats at most the page it was in
(and the broker refuses to act twice on a half copy it has already re-put: see checker_requests.py).
"""

from __future__ import annotations

from redis.asyncio import Redis
from redis.exceptions import RedisError

from tidemq_server.common.constants import checker_progress_key
from tidemq_server.common.redis import connect_redis


class ProgressUnavailable(Exception):
    """Redis did not answer: the scan stops and starts again from the last saved progress."""


class ProgressStore:
    def __init__(self, redis: Redis | str, cluster: str) -> None:
        self.redis = connect_redis(redis) if isinstance(redis, str) else redis
        self.cluster = cluster
        self.key = ""

    def bind(self, broker_name: str) -> None:
        self.key = checker_progress_key(self.cluster, broker_name)

    async def load(self) -> tuple[int, int, int]:
        """(half offset, op offset, op_from); zeros for a checker that never ran against this
        broker (and op_from = op offset for progress saved before op_from was kept)."""
        try:
            raw = await self.redis.hgetall(self.key)
        except RedisError as exc:
            raise ProgressUnavailable(f"reading {self.key}: {exc}") from exc
        op = int(raw.get("op", 0))
        return int(raw.get("half", 0)), op, int(raw.get("op_from", op))

    async def save(self, half: int, op: int, op_from: int) -> None:
        try:
            await self.redis.hset(self.key, mapping={"half": half, "op": op, "op_from": op_from})
        except RedisError as exc:
            raise ProgressUnavailable(f"writing {self.key}: {exc}") from exc

    async def close(self) -> None:
        await self.redis.aclose()
