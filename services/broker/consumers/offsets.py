"""Consumer offsets in Redis: ``(group, topic, queue) → next offset to consume``, per broker.

Queue ids are per broker and several broker groups may share one Redis, so every key carries
this broker's name (``broker_name``) after the cluster's: two groups never see each other's
offsets, and a consumer's offsets are per (group, topic, broker, queue).

A commit is answered only once Redis has it. Many requests commit at once (every push consumer
every 5 s), so commits are not sent one by one: ``commit`` queues the change and waits on a
future; one writer task drains everything queued, sends it as one pipeline (one round trip) and
resolves the futures. Resets and group deletes travel the same queue, so they apply in order with
the commits around them.

Redis down → ``ProtocolError(UNAVAILABLE)`` within the socket timeout; the client reconnects on
its own when Redis is back, and a failed batch only fails the requests in it (the writer lives on).

Keys (services/common/constants.py): ``consumer_offsets_key`` (hash queue id → offset) per
(broker, group, topic), ``consumer_offsets_index_key`` (set of topics) per (broker, group).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError
from redis.typing import EncodableT, FieldT
from tidemq.protocol import ErrorCode, ProtocolError

from services.common.constants import (
    consumer_offsets_index_key,
    consumer_offsets_index_pattern,
    consumer_offsets_key,
)
from services.common.loop import cancel_tasks
from services.common.redis import REDIS_TIMEOUT_S, connect_redis, text

log = logging.getLogger(__name__)

MAX_BATCH = 1024  # commits sent in one pipeline at most
SCAN_COUNT = 500  # keys Redis looks at per SCAN step when listing groups


def unavailable(what: str, exc: BaseException) -> ProtocolError:
    """The error a request gets when Redis cannot be reached (or answers with an error)."""
    return ProtocolError(ErrorCode.UNAVAILABLE,
                         f"{what}: Redis unreachable ({type(exc).__name__}: {exc}); retry later")


PipelineOp = Callable[[Pipeline], None]


@dataclass(slots=True)
class _Pending:
    op: PipelineOp  # adds this request's commands to the batch pipeline
    done: asyncio.Future[None]


class OffsetStore:
    """Committed consumer offsets, with concurrent commits coalesced into one round trip."""

    def __init__(self, redis_url: str, cluster: str, broker_name: str, *,
                 client: Redis | None = None, timeout_s: float = REDIS_TIMEOUT_S) -> None:
        self.cluster = cluster
        self.broker_name = broker_name
        self._redis = client if client is not None else connect_redis(redis_url, timeout_s)
        self._owns_client = client is None
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None
        self._closed = False
        self.round_trips = 0  # pipelines sent by the writer (tests and metrics read it)
        self.commits = 0  # commit/reset/delete requests written

    @property
    def redis(self) -> Redis:
        return self._redis

    def _key(self, group: str, topic: str) -> str:
        return consumer_offsets_key(self.cluster, self.broker_name, group, topic)

    def _index(self, group: str) -> str:
        return consumer_offsets_index_key(self.cluster, self.broker_name, group)

    async def start(self) -> None:
        if self._writer is None:
            self._closed = False
            self._writer = asyncio.create_task(self._write_loop(), name="offset-writer")

    async def close(self) -> None:
        self._closed = True
        await cancel_tasks(self._writer)
        self._writer = None
        while not self._queue.empty():
            pending = self._queue.get_nowait()
            _fail(pending.done, ProtocolError(ErrorCode.UNAVAILABLE, "offset store closed"))
        if self._owns_client:
            await self._redis.aclose()

    # --- writes: queued for the writer task --------------------------------------------------

    async def commit(self, group: str, offsets: list[tuple[str, int, int]]) -> None:
        """Store (topic, queue id, next offset) triples; returns once Redis has them."""
        by_topic: dict[str, dict[FieldT, EncodableT]] = {}
        for topic, queue_id, offset in offsets:
            if queue_id < 0 or offset < 0:
                raise ProtocolError(ErrorCode.BAD_REQUEST,
                                    f"offset {offset} for {topic} queue {queue_id}: "
                                    "queue id and offset must be >= 0")
            by_topic.setdefault(topic, {})[str(queue_id)] = offset
        if not by_topic:
            return

        def op(pipe: Pipeline) -> None:
            for topic, mapping in by_topic.items():
                pipe.hset(self._key(group, topic), mapping=mapping)
            pipe.sadd(self._index(group), *by_topic)

        await self._submit(op)

    async def reset(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        """Replace a (group, topic)'s offsets with exactly ``offsets`` (empty: forget the topic)."""
        key = self._key(group, topic)
        index = self._index(group)
        mapping: dict[FieldT, EncodableT] = {str(q): o for q, o in offsets.items()}

        def op(pipe: Pipeline) -> None:
            pipe.delete(key)
            if mapping:
                pipe.hset(key, mapping=mapping)
                pipe.sadd(index, topic)
            else:
                pipe.srem(index, topic)

        await self._submit(op)

    async def delete_group(self, group: str) -> None:
        """Forget every committed offset of a group."""
        topics = await self.topics(group)
        keys = [self._key(group, t) for t in topics]
        keys.append(self._index(group))

        def op(pipe: Pipeline) -> None:
            pipe.delete(*keys)

        await self._submit(op)

    # --- reads: straight to Redis ------------------------------------------------------------

    async def get(self, group: str, topic: str) -> dict[int, int]:
        """Committed offsets of a (group, topic): queue id → next offset ({} when none)."""
        try:
            raw = await self._redis.hgetall(self._key(group, topic))
        except (RedisError, OSError) as exc:
            raise unavailable(f"reading offsets of {group}/{topic}", exc) from exc
        return {int(text(q)): int(text(o)) for q, o in raw.items()}

    async def get_many(self, group: str, topics: list[str]) -> list[dict[int, int]]:
        """``get`` for several topics of a group in one pipelined round trip."""
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for topic in topics:
                    pipe.hgetall(self._key(group, topic))
                raws = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise unavailable(f"reading offsets of group {group}", exc) from exc
        return [{int(text(q)): int(text(o)) for q, o in raw.items()} for raw in raws]

    async def topics(self, group: str) -> list[str]:
        """Topics the group has committed offsets for, sorted."""
        try:
            raw = await self._redis.smembers(self._index(group))
        except (RedisError, OSError) as exc:
            raise unavailable(f"reading topics of group {group}", exc) from exc
        return sorted(text(t) for t in raw)

    async def groups(self) -> dict[str, list[str]]:
        """Every group with committed offsets → its topics, sorted (a SCAN of the index keys,
        then one pipelined read: an admin listing, not a hot path)."""
        prefix = self._index("")
        pattern = consumer_offsets_index_pattern(self.cluster, self.broker_name)
        try:
            keys = [text(k) async for k in self._redis.scan_iter(match=pattern,
                                                                 count=SCAN_COUNT)]
            async with self._redis.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.smembers(key)
                members = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise unavailable("listing consumer groups", exc) from exc
        found = {key[len(prefix):]: sorted(text(t) for t in topics)
                 for key, topics in zip(keys, members, strict=True)}
        return {group: found[group] for group in sorted(found) if found[group]}

    # --- the writer --------------------------------------------------------------------------

    async def _submit(self, op: PipelineOp) -> None:
        # Enqueued before the first await: writes reach Redis in the order they were submitted.
        if self._closed:
            raise ProtocolError(ErrorCode.UNAVAILABLE, "offset store is closed")
        if self._writer is None or self._writer.done():  # not started yet (or died): start it
            self._writer = asyncio.create_task(self._write_loop(), name="offset-writer")
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Pending(op, done))
        # shield: a cancelled request must not cancel the future the writer resolves.
        await asyncio.shield(done)

    async def _write_loop(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < MAX_BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                await self._write(batch)
            except asyncio.CancelledError:
                for pending in batch:
                    _fail(pending.done, ProtocolError(ErrorCode.UNAVAILABLE, "offset store closed"))
                raise
            except (RedisError, OSError) as exc:
                log.warning("offset commit of %d request(s) failed: Redis unreachable (%s)",
                            len(batch), exc)
                err = unavailable("committing offsets", exc)
                for pending in batch:
                    _fail(pending.done, err)
            except Exception as exc:  # a bug: fail these requests, keep the writer alive
                log.exception("offset commit of %d request(s) failed", len(batch))
                for pending in batch:
                    _fail(pending.done, ProtocolError(ErrorCode.INTERNAL_ERROR,
                                                      f"offset commit failed: {exc}"))
            else:
                for pending in batch:
                    if not pending.done.done():
                        pending.done.set_result(None)

    async def _write(self, batch: list[_Pending]) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            for pending in batch:
                pending.op(pipe)
            self.round_trips += 1
            await pipe.execute()
        self.commits += len(batch)


def _fail(done: asyncio.Future[None], exc: BaseException) -> None:
    if not done.done():
        done.set_exception(exc)
        done.exception()  # mark retrieved: a request that went away must not log "never retrieved"
