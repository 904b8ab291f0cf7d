"""The simple consumer: receive with an invisibility time, ack per message, change invisibility.

State per (group, topic), durable in Redis under this broker's name (that of its
``OffsetStore``: several broker groups may share one Redis) and mirrored in memory under one
asyncio.Lock:

- cursor (``receive_cursor_key``, hash queue id → offset): the next offset never handed out.
  A queue without one starts at the group's committed offset, else at the queue's min_offset.
- in-flight (``inflight_key``, hash ``"{queue_id}:{offset}"`` → ``"{visible_at_ms}:{nonce}:
  {deliveries}"``): messages handed out and not acked. Once ``visible_at_ms`` passes, the next
  receive hands the message out again (reconsume_times = deliveries so far) with a new nonce,
  which makes the older receipt handle stale.

A receive serves expired in-flight messages first, then new ones from the cursors, round robin
over the queues, and writes its changes in one MULTI pipeline. The memory mirror is loaded from
Redis on first use and dropped whenever a write fails, so it never claims more than Redis has.
After acks the group's committed offset (OffsetStore) moves to the lowest offset still in flight
(or the cursor), so offset views and lag stay meaningful.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from redis.asyncio import Redis
from redis.exceptions import RedisError
from redis.typing import EncodableT, FieldT
from tidemq.protocol import ErrorCode, ProtocolError

from tidemq_server.broker.consumers.offsets import OffsetStore, unavailable
from tidemq_server.broker.consumers.receipts import Receipt, decode_receipt, encode_receipt
from tidemq_server.broker.messaging.longpoll import PullHold
from tidemq_server.broker.messaging.pull import TagFilter
from tidemq_server.broker.store.types import GetResult, GetStatus, StoredRecord
from tidemq_server.common.constants import inflight_key, receive_cursor_key
from tidemq_server.common.redis import connect_redis, text

log = logging.getLogger(__name__)

MAX_RECEIVE = 1024  # messages one receive may ask for
MAX_INVISIBLE_MS = 12 * 3600 * 1000  # longest invisibility (12 h)
MAX_WAIT_MS = 60_000  # longest long poll of one receive
SCANS_PER_QUEUE = 4  # store reads per queue per receive when tags filter most messages out
MIN_POLL_S = 0.005  # shortest wait between two attempts of one long poll


class MessageSource(Protocol):
    """The part of the store's facade (services/broker/store) the simple consumer reads."""

    def get(self, topic: str, queue_id: int, offset: int, max_count: int,
            tag_codes: frozenset[int] | None = None) -> GetResult: ...

    def queue_offsets(self, topic: str, queue_id: int) -> tuple[int, int]: ...


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class Received:
    """One message handed out by ``receive``."""

    record: StoredRecord
    receipt_handle: str
    reconsume_times: int  # deliveries before this one (1 on the first redelivery)
    invisible_until_ms: int = 0  # wall clock ms when it becomes visible again unless acked


@dataclass(slots=True)
class _Inflight:
    visible_at: int  # ms since epoch
    nonce: int  # of the current delivery (in the receipt handle)
    deliveries: int  # times handed out

    def encode(self) -> str:
        return f"{self.visible_at}:{self.nonce}:{self.deliveries}"

    @classmethod
    def decode(cls, raw: str) -> _Inflight:
        visible_at, nonce, deliveries = raw.split(":")
        return cls(int(visible_at), int(nonce), int(deliveries))


def _field(queue_id: int, offset: int) -> str:
    return f"{queue_id}:{offset}"


@dataclass(slots=True)
class _TopicState:
    """Memory mirror of one (group, topic): cursors, in-flight entries and their indexes."""

    cursors: dict[int, int]
    committed: dict[int, int]  # last committed offset we know of, per queue
    inflight: dict[tuple[int, int], _Inflight] = field(default_factory=dict)
    due: list[tuple[int, int, int, int]] = field(default_factory=list)  # heap (vis, q, off, nonce)
    lowest: dict[int, list[int]] = field(default_factory=dict)  # per queue: heap of offsets
    rr: int = 0  # round-robin start for the next receive

    def put(self, queue_id: int, offset: int, entry: _Inflight, new: bool) -> None:
        self.inflight[(queue_id, offset)] = entry
        heapq.heappush(self.due, (entry.visible_at, queue_id, offset, entry.nonce))
        if new:
            heapq.heappush(self.lowest.setdefault(queue_id, []), offset)
        if len(self.due) > 2 * len(self.inflight) + 64:  # drop stale heap items in bulk
            self.due = [(e.visible_at, q, o, e.nonce) for (q, o), e in self.inflight.items()]
            heapq.heapify(self.due)

    def pop_due(self, now: int, queues: set[int], limit: int) -> list[tuple[int, int]]:
        """Up to ``limit`` in-flight messages of ``queues`` visible again at ``now``."""
        taken: list[tuple[int, int]] = []
        others: list[tuple[int, int, int, int]] = []
        while self.due and len(taken) < limit and self.due[0][0] <= now:
            item = heapq.heappop(self.due)
            visible_at, queue_id, offset, nonce = item
            entry = self.inflight.get((queue_id, offset))
            if entry is None or entry.nonce != nonce or entry.visible_at != visible_at:
                continue  # stale: acked or handed out again since
            if queue_id in queues:
                taken.append((queue_id, offset))
            else:
                others.append(item)
        for item in others:
            heapq.heappush(self.due, item)
        return taken

    def earliest(self, queues: set[int]) -> int | None:
        """When the next in-flight message of ``queues`` becomes visible again."""
        return min((e.visible_at for (q, _), e in self.inflight.items() if q in queues),
                   default=None)

    def low_water(self, queue_id: int) -> int | None:
        """Lowest offset in flight in a queue, else its cursor (None: never received)."""
        heap = self.lowest.get(queue_id)
        while heap and (queue_id, heap[0]) not in self.inflight:
            heapq.heappop(heap)
        return heap[0] if heap else self.cursors.get(queue_id)


class SimpleConsumerService:
    """receive / ack / change_invisibility for simple consumer groups (docs/api.md)."""

    def __init__(self, store: MessageSource, redis_url_or_client: str | Redis, cluster: str,
                 hold: PullHold, offsets: OffsetStore,
                 clock_ms: Callable[[], int] = _wall_ms) -> None:
        self.store = store
        self.cluster = cluster
        self.broker_name = offsets.broker_name  # keys per broker, as its offsets
        self.hold = hold
        self.offsets = offsets
        self.clock_ms = clock_ms
        if isinstance(redis_url_or_client, str):
            self._redis, self._owns_client = connect_redis(redis_url_or_client), True
        else:
            self._redis, self._owns_client = redis_url_or_client, False
        self._states: dict[tuple[str, str], _TopicState] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self.delivered = 0  # messages handed out, redeliveries included (metrics)
        self.acked = 0

    async def close(self) -> None:
        if self._owns_client:
            await self._redis.aclose()

    # --- receive -----------------------------------------------------------------------------

    async def receive(self, group: str, topic: str, queue_ids: list[int], tags: str = "*",
                      max_count: int = 16, invisible_ms: int = 30_000,
                      wait_ms: int = 20_000) -> list[Received]:
        """Hand out up to ``max_count`` messages, waiting up to ``wait_ms`` when none is ready."""
        _validate_range("max", max_count, 1, MAX_RECEIVE)
        _validate_range("invisible_ms", invisible_ms, 0, MAX_INVISIBLE_MS)
        _validate_range("wait_ms", wait_ms, 0, MAX_WAIT_MS)
        queues = list(dict.fromkeys(queue_ids))
        if not queues:
            return []
        expression = TagFilter.parse(tags)
        wanted, codes = expression.tags, expression.codes
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        keys = [(topic, q) for q in queues]
        while True:
            with self.hold.watch(keys) as watch:  # opened first: no notify slips past the check
                got, earliest = await self._attempt(group, topic, queues, wanted, codes,
                                                    max_count, invisible_ms)
                left = deadline - loop.time()
                if got or left <= 0 or self.hold.closed:
                    return got
                if earliest is not None:
                    left = min(left, (earliest - self.clock_ms()) / 1000)
                await watch.wait(max(left, MIN_POLL_S))

    async def _attempt(self, group: str, topic: str, queues: list[int],
                       wanted: frozenset[str] | None, codes: frozenset[int] | None,
                       max_count: int, invisible_ms: int,
                       ) -> tuple[list[Received], int | None]:
        key = (group, topic)
        async with self._lock(key):
            state = await self._state(group, topic)
            try:
                return await self._attempt_locked(state, group, topic, queues, wanted, codes,
                                                  max_count, invisible_ms)
            except BaseException:
                self._states.pop(key, None)  # memory may be ahead of Redis: reload next time
                raise

    async def _attempt_locked(self, state: _TopicState, group: str, topic: str,
                              queues: list[int], wanted: frozenset[str] | None,
                              codes: frozenset[int] | None, max_count: int, invisible_ms: int,
                              ) -> tuple[list[Received], int | None]:
        now = self.clock_ms()
        visible_at = now + invisible_ms
        out: list[Received] = []
        set_inflight: dict[FieldT, EncodableT] = {}
        del_inflight: list[str] = []
        set_cursor: dict[FieldT, EncodableT] = {}

        for queue_id, offset in state.pop_due(now, set(queues), max_count):
            entry = state.inflight[(queue_id, offset)]
            record = self._read_one(topic, queue_id, offset)
            if record is None or (wanted is not None and record.tag not in wanted):
                del state.inflight[(queue_id, offset)]  # gone from the store, or filtered out
                del_inflight.append(_field(queue_id, offset))
                continue
            previous = entry.deliveries
            entry = _Inflight(visible_at, secrets.randbits(64), previous + 1)
            state.put(queue_id, offset, entry, new=False)
            set_inflight[_field(queue_id, offset)] = entry.encode()
            handle = encode_receipt(group, topic, queue_id, offset, entry.nonce)
            out.append(Received(record, handle, previous, visible_at))

        pending = queues[state.rr % len(queues):] + queues[: state.rr % len(queues)]
        state.rr += 1
        while len(out) < max_count and pending:
            quota = math.ceil((max_count - len(out)) / len(pending))
            full: list[int] = []
            for queue_id in pending:
                want = min(quota, max_count - len(out))
                if want <= 0:
                    break
                cursor = state.cursors.get(queue_id)
                if cursor is None:
                    cursor = state.committed.get(queue_id)
                    if cursor is None:
                        cursor = self.store.queue_offsets(topic, queue_id)[0]
                records, moved = self._take(topic, queue_id, cursor, want, wanted, codes,
                                            state.inflight)
                if moved != state.cursors.get(queue_id):
                    state.cursors[queue_id] = moved
                    set_cursor[str(queue_id)] = moved
                for record in records:
                    entry = _Inflight(visible_at, secrets.randbits(64), 1)
                    state.put(queue_id, record.queue_offset, entry, new=True)
                    set_inflight[_field(queue_id, record.queue_offset)] = entry.encode()
                    handle = encode_receipt(group, topic, queue_id, record.queue_offset,
                                            entry.nonce)
                    out.append(Received(record, handle, 0, visible_at))
                if len(records) == want:
                    full.append(queue_id)  # may hold more: offer it another share
            pending = full

        if set_inflight or del_inflight or set_cursor:
            await self._write(group, topic, set_inflight, del_inflight, set_cursor)
        self.delivered += len(out)
        return out, (None if out else state.earliest(set(queues)))

    def _take(self, topic: str, queue_id: int, cursor: int, want: int,
              wanted: frozenset[str] | None, codes: frozenset[int] | None,
              inflight: dict[tuple[int, int], _Inflight],
              ) -> tuple[list[StoredRecord], int]:
        """Up to ``want`` matching records from ``cursor``; returns them and the new cursor.

        Records already in flight (a cursor moved back by a reset) are passed over: a message is
        never out twice at once.
        """
        records: list[StoredRecord] = []
        for _ in range(SCANS_PER_QUEUE):
            result = self.store.get(topic, queue_id, cursor, want - len(records), codes)
            if result.status == GetStatus.OFFSET_OVERFLOW:
                log.warning("receive %s queue %d: cursor %d beyond max offset %d, moved back",
                            topic, queue_id, cursor, result.max_offset)
                return records, result.max_offset
            if result.status in (GetStatus.NO_MESSAGE, GetStatus.NO_QUEUE):
                break
            for record in result.records:
                if (queue_id, record.queue_offset) in inflight:
                    continue
                if wanted is None or record.tag in wanted:  # tag hashes may collide
                    records.append(record)
                    if len(records) == want:
                        return records, record.queue_offset + 1
            if result.next_offset <= cursor:
                break
            cursor = result.next_offset
            if cursor >= result.max_offset:
                break
        return records, cursor

    def _read_one(self, topic: str, queue_id: int, offset: int) -> StoredRecord | None:
        result = self.store.get(topic, queue_id, offset, 1)
        for record in result.records:
            if record.queue_offset == offset:
                return record
        return None

    # --- ack and invisibility ----------------------------------------------------------------

    async def ack(self, group: str, receipt_handles: list[str]) -> int:
        """Ack deliveries; returns how many were current (stale or repeated handles count 0)."""
        receipts = [self._receipt(group, h) for h in receipt_handles]
        by_topic: dict[str, list[Receipt]] = {}
        for receipt in receipts:
            by_topic.setdefault(receipt.topic, []).append(receipt)
        acked = 0
        for topic, items in by_topic.items():
            key = (group, topic)
            async with self._lock(key):
                state = await self._state(group, topic)
                fields: list[str] = []
                commits: list[tuple[str, int, int]] = []
                for r in items:
                    entry = state.inflight.get((r.queue_id, r.offset))
                    if entry is not None and entry.nonce == r.nonce:
                        del state.inflight[(r.queue_id, r.offset)]
                        fields.append(_field(r.queue_id, r.offset))
                if not fields:
                    continue
                try:
                    await self._redis.hdel(self._inflight_key(group, topic), *fields)
                except (RedisError, OSError) as exc:
                    self._states.pop(key, None)
                    raise unavailable(f"ack for group {group}", exc) from exc
                except BaseException:
                    self._states.pop(key, None)
                    raise
                acked += len(fields)
                for queue_id in sorted({r.queue_id for r in items}):
                    low = state.low_water(queue_id)
                    if low is not None and low != state.committed.get(queue_id):
                        state.committed[queue_id] = low
                        commits.append((topic, queue_id, low))
            # Right after the lock, before any other await: commits reach the offset writer in
            # the order their values were computed, so a lower value never lands last.
            if commits:
                await self._commit(group, state, commits)
        self.acked += acked
        return acked

    async def change_invisibility(self, group: str, receipt_handle: str,
                                  invisible_ms: int) -> str:
        """Make a received message invisible ``invisible_ms`` from now; returns its new handle.
        Like ``ack``, it takes a handle whose invisibility ran out while nobody received the
        message again."""
        _validate_range("invisible_ms", invisible_ms, 0, MAX_INVISIBLE_MS)
        r = self._receipt(group, receipt_handle)
        key = (group, r.topic)
        async with self._lock(key):
            state = await self._state(group, r.topic)
            now = self.clock_ms()
            entry = state.inflight.get((r.queue_id, r.offset))
            # the rule ack follows too: a handle is current until the message is acked or
            # handed out again, also after its invisibility ran out (docs/api.md)
            if entry is None or entry.nonce != r.nonce:
                raise ProtocolError(ErrorCode.INVALID_RECEIPT_HANDLE,
                                    "receipt handle is acked or superseded by a later delivery; "
                                    "receive the message again")
            entry = _Inflight(now + invisible_ms, secrets.randbits(64), entry.deliveries)
            state.put(r.queue_id, r.offset, entry, new=False)
            try:
                await self._redis.hset(self._inflight_key(group, r.topic),
                                       _field(r.queue_id, r.offset), entry.encode())
            except BaseException as exc:
                self._states.pop(key, None)
                if isinstance(exc, RedisError | OSError):
                    raise unavailable(f"change invisibility for group {group}", exc) from exc
                raise
        return encode_receipt(group, r.topic, r.queue_id, r.offset, entry.nonce)

    async def inflight_count(self, group: str, topic: str) -> int:
        """Messages of a (group, topic) handed out and not acked."""
        async with self._lock((group, topic)):
            return len((await self._state(group, topic)).inflight)

    # --- state and Redis ---------------------------------------------------------------------

    def _inflight_key(self, group: str, topic: str) -> str:
        return inflight_key(self.cluster, self.broker_name, group, topic)

    def _cursor_key(self, group: str, topic: str) -> str:
        return receive_cursor_key(self.cluster, self.broker_name, group, topic)

    def _lock(self, key: tuple[str, str]) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    @staticmethod
    def _receipt(group: str, handle: str) -> Receipt:
        receipt = decode_receipt(handle)
        if not receipt.belongs_to(group):
            raise ProtocolError(ErrorCode.INVALID_RECEIPT_HANDLE,
                                f"receipt handle was issued to another group than {group!r}")
        return receipt

    async def _state(self, group: str, topic: str) -> _TopicState:
        """The memory mirror of (group, topic), loaded from Redis on first use (lock held)."""
        state = self._states.get((group, topic))
        if state is not None:
            return state
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hgetall(self._cursor_key(group, topic))
                pipe.hgetall(self._inflight_key(group, topic))
                raw_cursors, raw_inflight = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise unavailable(f"receive state of group {group}", exc) from exc
        committed = await self.offsets.get(group, topic)
        state = _TopicState(cursors={int(text(q)): int(text(o)) for q, o in raw_cursors.items()},
                            committed=committed)
        for name, value in raw_inflight.items():
            try:
                queue_id, offset = (int(x) for x in text(name).split(":"))
                state.put(queue_id, offset, _Inflight.decode(text(value)), new=True)
            except ValueError:
                log.warning("group %s topic %s: unreadable in-flight entry %r=%r ignored",
                            group, topic, name, value)
        self._states[(group, topic)] = state
        return state

    async def _write(self, group: str, topic: str, set_inflight: dict[FieldT, EncodableT],
                     del_inflight: list[str], set_cursor: dict[FieldT, EncodableT]) -> None:
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                if set_inflight:
                    pipe.hset(self._inflight_key(group, topic), mapping=set_inflight)
                if del_inflight:
                    pipe.hdel(self._inflight_key(group, topic), *del_inflight)
                if set_cursor:
                    pipe.hset(self._cursor_key(group, topic), mapping=set_cursor)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            raise unavailable(f"receive for group {group}", exc) from exc

    async def _commit(self, group: str, state: _TopicState,
                      commits: list[tuple[str, int, int]]) -> None:
        try:
            await self.offsets.commit(group, commits)
        except ProtocolError as exc:  # the acks stand; the next ack commits again
            for _, queue_id, _ in commits:
                state.committed.pop(queue_id, None)
            log.warning("group %s: acked, but committing offsets failed: %s", group, exc.message)


def _validate_range(name: str, value: int, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ProtocolError(ErrorCode.BAD_REQUEST,
                            f"{name} must be an integer from {low} to {high}, got {value!r}")
