"""The scheduler's progress in Redis (services/common/constants.py names the keys).

- ``scheduler_progress_key``: ``intake`` (next intake offset), ``level:{q}`` (next offset of
  level queue q), ``level-intent:{q}`` (end of the level batch being delivered);
- ``scheduler_level_cancels_key``: cancelled level messages not yet passed by the walk;
- ``scheduler_rebuild_key``: ``floor``, the intake offset a rebuild of the timer log reads from
  (services/scheduler/rolls.py).

The timer log, not Redis, is the truth for what was taken in from the intake topic; Redis is
the truth for how far each level queue was delivered.
"""

from __future__ import annotations

from redis.asyncio import Redis

from tidemq_server.common.constants import (
    scheduler_level_cancels_key,
    scheduler_progress_key,
    scheduler_rebuild_key,
)
from tidemq_server.common.redis import connect_redis, text


class Progress:
    def __init__(self, redis_url: str, cluster: str, broker_name: str) -> None:
        self.redis: Redis = connect_redis(redis_url)
        self.key = scheduler_progress_key(cluster, broker_name)
        self.cancels_key = scheduler_level_cancels_key(cluster, broker_name)
        self.rebuild_key = scheduler_rebuild_key(cluster, broker_name)

    async def close(self) -> None:
        await self.redis.aclose()

    async def load(self) -> tuple[int, dict[int, int], dict[int, int]]:
        """(intake offset, level offsets, level intents)."""
        raw = await self.redis.hgetall(self.key)
        intake = 0
        levels: dict[int, int] = {}
        intents: dict[int, int] = {}
        for k, v in raw.items():
            name, value = text(k), int(text(v))
            if name == "intake":
                intake = value
            elif name.startswith("level-intent:"):
                intents[int(name.split(":", 1)[1])] = value
            elif name.startswith("level:"):
                levels[int(name.split(":", 1)[1])] = value
        return intake, levels, intents

    async def rebuild_floor(self) -> int | None:
        """The saved rebuild floor; None when no scheduler saved one yet."""
        raw = await self.redis.hget(self.rebuild_key, "floor")
        return None if raw is None else int(text(raw))

    async def set_rebuild_floor(self, offset: int) -> None:
        await self.redis.hset(self.rebuild_key, "floor", offset)

    async def set_intake(self, offset: int) -> None:
        await self.redis.hset(self.key, "intake", offset)

    async def begin_level(self, qid: int, end: int) -> None:
        await self.redis.hset(self.key, f"level-intent:{qid}", end)

    async def end_level(self, qid: int, offset: int) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.key, f"level:{qid}", offset)
        pipe.hdel(self.key, f"level-intent:{qid}")
        await pipe.execute()

    async def load_cancels(self) -> dict[tuple[int, int], tuple[int, str]]:
        raw = await self.redis.hgetall(self.cancels_key)
        out: dict[tuple[int, int], tuple[int, str]] = {}
        for k, v in raw.items():
            qid, offset = text(k).split(":")
            due, _, mid = text(v).partition(" ")
            out[(int(qid), int(offset))] = (int(due), mid)
        return out

    async def add_cancel(self, qid: int, offset: int, due: int, mid: str) -> None:
        await self.redis.hset(self.cancels_key, f"{qid}:{offset}",
                              f"{due} {mid}")

    async def drop_cancels(self, keys: list[tuple[int, int]]) -> None:
        if keys:
            await self.redis.hdel(self.cancels_key,
                                  *(f"{q}:{o}" for q, o in keys))
