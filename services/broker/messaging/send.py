"""The send path: validate a batch as a whole, pick queues, de-duplicate, store, answer.

Hot path: no pydantic, no Redis, one ``Appender.append`` per request (store/appender.py: the
store's writer, or the replication gate around it), metrics counted per batch.
Delayed delivery goes through one seam, ``DelayRouter``
(``tidemq_server.broker.delays.routing``): it validates a message's delay and stores a delayed
message as its waiting copy.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import zlib
from typing import Any, cast

from tidemq.protocol import (
    REAL_TOPIC,
    UNIQ_KEY,
    ErrorCode,
    Limits,
    OutgoingMessage,
    Perm,
    ProtocolError,
    is_system_topic,
    parse_messages,
    validate_topic_name,
)

from tidemq_server.broker.delays.routing import DelayRouter
from tidemq_server.broker.messaging.convert import new_message_id, to_record
from tidemq_server.broker.messaging.dedup import DedupCache, DedupKey, Placed, WriteFuture
from tidemq_server.broker.messaging.intake import BatchIntake
from tidemq_server.broker.messaging.query import MessageState
from tidemq_server.broker.messaging.topics import TopicConfig, TopicManager
from tidemq_server.broker.observability import BrokerMetrics
from tidemq_server.broker.store.appender import Appender
from tidemq_server.broker.store.store import MessageStore
from tidemq_server.broker.store.types import (
    Appended,
    MessageRecord,
    PutResult,
    PutStatus,
    StoredRecord,
)
from tidemq_server.common.clock import now_ms
from tidemq_server.common.logs import note_message_ids

log = logging.getLogger(__name__)

#: PutStatus → the error a client gets (OK is absent: it is not an error).
PUT_ERRORS: dict[PutStatus, tuple[ErrorCode, str]] = {
    PutStatus.BUSY: (ErrorCode.BROKER_BUSY,
                     "broker busy: the write queue is full; retry after Retry-After seconds"),
    PutStatus.DISK_FULL: (ErrorCode.DISK_FULL,
                          "the broker's disk is full and nothing can be deleted; writes refused"),
    PutStatus.UNAVAILABLE: (ErrorCode.UNAVAILABLE,
                            "the store is closed or unavailable; retry on another broker"),
    # 500, not 503: the batch may be partly on disk, so a client retries here (dedup answers
    # the first result) instead of moving the message to another broker group
    PutStatus.WRITE_FAILED: (ErrorCode.INTERNAL_ERROR,
                             "the store's write failed and the broker stopped writing; part of "
                             "the request may be stored: retry with the same message ids"),
    PutStatus.TOO_LARGE: (ErrorCode.MESSAGE_TOO_LARGE,
                          "a record is larger than a commit log segment can hold"),
    PutStatus.INVALID: (ErrorCode.BAD_REQUEST,
                        "a record field is out of the range the store keeps; nothing was stored"),
    PutStatus.NOT_PRIMARY: (ErrorCode.NOT_PRIMARY,
                            "this broker does not take writes; send to the group's primary"),
    PutStatus.NOT_ENOUGH_REPLICAS: (ErrorCode.NOT_ENOUGH_REPLICAS,
                                    "fewer in-sync copies than min_insync hold the records, so "
                                    "they are not acknowledged; retry later with the same "
                                    "message ids (a record already written is not stored "
                                    "twice)"),
}


def appended_or_raise(result: PutResult) -> list[Appended]:
    """The appended records of a successful put, or the ProtocolError its status maps to."""
    if result.status is PutStatus.OK:
        return result.appended
    code, text = PUT_ERRORS[result.status]
    raise ProtocolError(code, f"{text} ({result.message})" if result.message else text)


# --- the send service ---------------------------------------------------------------------------

class SendService:
    def __init__(self, store: MessageStore, appender: Appender, topics: TopicManager,
                 dedup: DedupCache, metrics: BrokerMetrics, limits: Limits,
                 delay_router: DelayRouter, *, auto_create_queues: int | None = None) -> None:
        self.store = store  # reads (the unique-key index); writes go through ``appender``
        self.appender = appender
        self.topics = topics
        self.dedup = dedup
        self.metrics = metrics
        self.limits = limits
        self.delay_router = delay_router
        self.auto_create_queues = auto_create_queues  # None: auto-creation off
        # a send request's body at most: JSON may escape a byte into up to 6 characters
        self.max_request_bytes = 6 * limits.max_batch_bytes + 1024 * 1024
        self._round_robin = itertools.count()
        self.intake = BatchIntake(self)

    async def writable_topic(self, topic: str) -> TopicConfig:
        """The topic a public send may write, creating it when auto-creation is on."""
        cfg = self.topics.get(topic)
        if cfg is None:
            validate_topic_name(topic)
            if is_system_topic(topic):
                raise _forbidden(topic)
            if self.auto_create_queues is None:
                raise self.topics.not_found(topic)
            cfg, _ = await self.topics.put(topic, self.auto_create_queues, Perm.READ_WRITE)
        elif cfg.system:
            raise _forbidden(topic)
        if not cfg.perm.writable:
            raise ProtocolError(ErrorCode.BAD_REQUEST,
                                f"topic {topic!r} is read-only on this broker (perm "
                                f"{cfg.perm.value!r}); send to a writable broker")
        return cfg

    def select_queue(self, cfg: TopicConfig, msg: OutgoingMessage) -> int:
        if msg.queue_id is not None:
            if msg.queue_id >= cfg.queues:
                raise ProtocolError(ErrorCode.BAD_REQUEST,
                                    f"queue_id {msg.queue_id} does not exist: topic "
                                    f"{cfg.name!r} has queues 0-{cfg.queues - 1}")
            return msg.queue_id
        if msg.sharding_key is not None:
            return zlib.crc32(msg.sharding_key.encode("utf-8")) % cfg.queues
        return next(self._round_robin) % cfg.queues

    async def send(self, topic: str, payload: Any, host: str) -> list[dict[str, Any]]:
        """Store a ``{messages: [...]}`` request; the results in request order."""
        cfg = await self.writable_topic(topic)
        msgs = parse_messages(payload, self.limits)
        now = now_ms()
        records: list[MessageRecord] = []
        ids: list[str] = []
        given: list[bool] = []
        # validate everything and build the records before anything is stored
        validate_delay = self.delay_router.validate
        for msg in msgs:
            due = (validate_delay(msg, now) if msg.delay_level or msg.delay_ms is not None
                   or msg.deliver_at_ms is not None else None)
            queue_id = self.select_queue(cfg, msg)
            mid = msg.message_id or new_message_id()
            record = to_record(msg, topic, queue_id, mid, now, host)
            if due is not None:
                record = self.delay_router.route(record, msg, due)
            records.append(record)
            ids.append(mid)
            given.append(msg.message_id is not None)
        note_message_ids(ids)  # for JSON log lines; nothing with text logs
        repeated: set[int] = set()
        placed = await self.put_records(records, given, now, repeated)
        return self.results(ids, placed, repeated, topic)

    async def send_batches(self, topic: str, raw: bytes, host: str) -> dict[str, Any]:
        """Store a request of producer-made v2 batches (``messaging/intake.py``)."""
        return await self.intake.send(topic, raw, host)

    def results(self, ids: list[str], placed: list[Placed], repeated: set[int],
                topic: str | None = None) -> list[dict[str, Any]]:
        """A send's answer per message (to ``topic``), in request order."""
        return [{"message_id": mid, "queue_id": p.queue_id, "queue_offset": p.queue_offset}
                if p.waiting is None else self._waiting_result(mid, p, i in repeated, topic)
                for i, (mid, p) in enumerate(zip(ids, placed, strict=True))]

    def _waiting_result(self, message_id: str, placed: Placed, repeated: bool,
                        topic: str | None) -> dict[str, Any]:
        """A delayed message has no position in its queue until it is delivered: the result
        names the queue it will be delivered to, no offset, and its due time. A repeated send
        also says whether it was cancelled or delivered since."""
        assert placed.waiting is not None
        queue_id, due = placed.waiting
        result: dict[str, Any] = {"message_id": message_id, "queue_id": queue_id,
                                  "queue_offset": None, "state": MessageState.SCHEDULED.value,
                                  "deliver_at_ms": due}
        if repeated:
            result.update(self.delay_router.standing(message_id, topic) or {})
        return result

    async def put_records(self, records: list[MessageRecord], dedup: list[bool],
                          now: int, repeated: set[int] | None = None) -> list[Placed]:
        """Store ``records`` (one store write), except those whose ``dedup`` flag is set and
        whose (topic, UNIQ_KEY) was stored within the window: they get the first result (and
        their index goes into ``repeated``, when given)."""
        cache = self.dedup
        n = len(records)
        placed: list[Placed | None] = [None] * n
        to_store: list[int] = []
        same_as: list[tuple[int, int]] = []  # (i, j): record i repeats record j of this batch
        waits: list[tuple[int, WriteFuture, int]] = []  # (i, write of its first copy, index)
        keys: dict[int, DedupKey] = {}
        indexed: list[tuple[DedupKey, Placed, int]] = []  # first copies found in the index
        settle_end = 0  # where the newest of them ends
        if cache.enabled:
            cache.expire(now)
            use_index = cache.needs_index(now)
            first: dict[DedupKey, int] = {}
            for i, record in enumerate(records):
                if dedup[i]:
                    key = (self.dedup_topic(record), record.properties[UNIQ_KEY])
                    j = first.setdefault(key, i)
                    if j != i:
                        same_as.append((i, j))
                        continue
                    hit = cache.lookup(key, now)
                    if hit is None and (other := cache.in_flight(key)) is not None:
                        waits.append((i, *other))
                        continue
                    if hit is None and use_index and (found := self.indexed(key, now)):
                        hit, stored, end = found
                        indexed.append((key, hit, stored))
                        settle_end = max(settle_end, end)
                    if hit is not None:
                        placed[i] = hit
                        if repeated is not None:
                            repeated.add(i)
                        continue
                    keys[i] = key
                to_store.append(i)
        else:
            to_store = list(range(n))
        if indexed:  # first copies perhaps never acknowledged: settle them, then remember
            appended_or_raise(PutResult(await self.appender.settle(settle_end)))
            for key, where, stored in indexed:
                cache.remember(key, where, stored)
        if to_store and keys:
            # in flight from here: a concurrent duplicate waits for this write's result. The
            # write runs as its own task so that its result is remembered even if this
            # request is cancelled (client gone) while the store is still writing it.
            future = cache.begin(keys)
            write = asyncio.ensure_future(self._store(records, to_store, placed, keys, future))
            write.add_done_callback(_retrieve)
            await asyncio.shield(write)
        elif to_store:
            await self._store(records, to_store, placed)
        for i, fut, j in waits:
            placed[i] = (await asyncio.shield(fut))[j]
        for i, j in same_as:
            placed[i] = placed[j]
        duplicates = n - len(to_store)
        if duplicates:
            cache.count_hits(duplicates)
            self.metrics.dedup_hits.inc(duplicates)
        return cast(list[Placed], placed)  # every slot is filled above

    async def _store(self, records: list[MessageRecord], to_store: list[int],
                     placed: list[Placed | None], keys: dict[int, DedupKey] | None = None,
                     future: WriteFuture | None = None) -> None:
        """One store write of ``records[i] for i in to_store``; fills ``placed`` and settles
        the dedup ``future`` of ``keys`` (the places, or the error for the waiters)."""
        cache = self.dedup
        batch = records if len(to_store) == len(records) else [records[i] for i in to_store]
        started = time.perf_counter()
        try:
            result = await self.appender.append(batch)
            self.metrics.observe_put(batch[0].topic, batch, result.status,
                                     time.perf_counter() - started)
            if result.status is not PutStatus.OK:
                # the records may be in the log unacknowledged: a retry must find them there
                cache.mark_incomplete(now_ms())
            appended = appended_or_raise(result)
        except BaseException as exc:
            err = exc if isinstance(exc, ProtocolError) else ProtocolError(
                ErrorCode.UNAVAILABLE, f"store write failed: {type(exc).__name__}")
            if future is not None and keys:
                cache.finish(keys, future, None, err)
            raise
        waiting = self.delay_router.waiting
        stored_ms = [0] * len(records) if future is not None else []
        for i, app in zip(to_store, appended, strict=True):
            placed[i] = Placed(app.queue_id, app.queue_offset, waiting(records[i]))
            if stored_ms:
                stored_ms[i] = app.store_timestamp
        if future is not None and keys:
            cache.finish(keys, future, placed, stored_ms=stored_ms)

    def dedup_topic(self, record: MessageRecord | StoredRecord) -> str:
        """The topic a message id is de-duplicated in: a waiting (delayed) copy's real topic,
        so that a retry sent after the due time — stored in the real topic at once — finds
        the waiting copy of its first attempt (the faults suite saw both delivered)."""
        return (record.properties[REAL_TOPIC] if self.delay_router.waiting(record)
                else record.topic)

    def indexed(self, key: DedupKey, now: int) -> tuple[Placed, int, int] | None:
        """The first copy of ``key`` in the store's unique-key index within the window, its
        store time and its end offset. The whole log counts, above the high-water mark too: a
        promoted replica keeps what it copied, and a write answered NOT_ENOUGH_REPLICAS stays
        in the log."""
        topic, mid = key
        horizon = now - self.dedup.window_ms
        for rec in self.store.find_by_unique_key(mid, whole_log=True, since_ms=horizon):
            if self.dedup_topic(rec) == topic and rec.store_timestamp >= horizon:
                where = Placed(rec.queue_id, rec.queue_offset, self.delay_router.waiting(rec))
                return where, rec.store_timestamp, rec.physical_offset + rec.size
        return None


def _retrieve(task: asyncio.Future[None]) -> None:
    """Mark a write's error as seen: its request may be gone (the error went to the waiters)."""
    if not task.cancelled():
        task.exception()


def _forbidden(topic: str) -> ProtocolError:
    return ProtocolError(ErrorCode.FORBIDDEN_SYSTEM_TOPIC,
                         f"{topic!r} is a system topic: it cannot be written through the public "
                         "API (reading it is allowed)")
