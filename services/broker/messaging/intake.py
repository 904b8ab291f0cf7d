"""The send path for producer-made batches (``application/x-tidemq-batch``): record format v2
as the log stores it (``tidemq.protocol.records.v2``), appended without decoding a body.

A request body is one or more batches, each for one queue of the request's topic. In order:

1. every batch is validated whole before anything is stored (``batch_read.validate``, strict:
   sizes, CRCs, ids, tags, keys, properties with no reserved name but the sharding key,
   delays, limits); the first failure is a 400 (or 413) naming the batch, the record index and
   the field, e.g. ``batches[1].records[3].crc: ...``. Then the request as a whole: its topic
   (writable, each batch names it), each batch's queue (one the topic has) and sys_flag (0),
   and the API's batch limits over every batch together;
2. the common case — no record delayed, no message id seen before (``SendService``'s dedup
   layers: the recent map, the writes in flight, the unique-key index), no id twice in the
   request — appends the batches as they are (``Appender.append_batches``, one group commit)
   and answers compactly: per batch its queue, the queue offset of its first record and its
   count (record i of a batch is at that offset + i);
3. anything else — a delayed record (its waiting copy goes to a system topic), a duplicate —
   is rare: the request's records are decoded into store records and take the JSON/msgpack
   path (``SendService.put_records``), which answers per message as a JSON send does (and,
   as a JSON send, refuses one id twice in the request with other content: 400).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from tidemq.protocol import ErrorCode, ProtocolError
from tidemq.protocol.message import Limits
from tidemq.protocol.records.v2 import CLIENT_PROPERTIES, DelayKind
from tidemq.protocol.records.v2_read import BatchError, BatchSummary, decode_record, split, validate

from tidemq_server.broker.messaging.dedup import DedupKey, Run
from tidemq_server.broker.store.records import v1 as v1
from tidemq_server.broker.store.records.entry import store_properties
from tidemq_server.broker.store.records.v2_own import Batch
from tidemq_server.broker.store.types import MessageRecord, PutStatus
from tidemq_server.common.clock import now_ms
from tidemq_server.common.logs import ids_wanted, note_message_ids

if TYPE_CHECKING:
    from tidemq_server.broker.messaging.send import SendService


class BatchIntake:
    """``SendService.send_batches``: one request of producer-made batches."""

    def __init__(self, sender: SendService) -> None:
        self.sender = sender

    def parse(self, topic: str, raw: bytes, queues: int) -> list[BatchSummary]:
        """Validate every batch of ``raw`` (step 1); the summaries in order."""
        limits = self.sender.limits
        summaries: list[BatchSummary] = []
        for k, (at, size) in enumerate(split(raw)):
            try:
                s = validate(raw, at, strict=True, allowed=CLIENT_PROPERTIES, limits=limits,
                             end=at + size)
            except BatchError as exc:
                raise BatchError(exc.field, exc.why, exc.index, exc.code, batch=k) from None
            head = s.head
            if head.topic != topic:
                raise BatchError("topic", f"{head.topic!r}, but the request is for {topic!r}",
                                 batch=k)
            if not 0 <= head.queue_id < queues:
                raise BatchError("queue_id", f"{head.queue_id} does not exist: topic "
                                 f"{topic!r} has queues 0-{queues - 1}", batch=k)
            if head.sys_flag:
                raise BatchError("sys_flag", f"{head.sys_flag}: a public send writes plain "
                                 "messages (0)", batch=k)
            summaries.append(s)
        check_limits(summaries, limits)
        return summaries

    async def send(self, topic: str, raw: bytes, host: str) -> dict[str, Any]:
        sender = self.sender
        cfg = await sender.writable_topic(topic)
        summaries = self.parse(topic, raw, cfg.queues)
        if ids_wanted():  # JSON log lines name the messages sent
            note_message_ids([mid for s in summaries for mid in s.message_ids])
        now = now_ms()
        keys = self._fresh_keys(topic, summaries, now)
        if keys is None:
            return {"results": await self._one_by_one(topic, raw, summaries, host, now)}
        spans = split(raw)
        born = v1.encode_host(host)
        batches = [Batch(raw[at:at + size], s, born)
                   for (at, size), s in zip(spans, summaries, strict=True)]
        cache = sender.dedup
        if not keys:
            placed = await self._append(topic, batches)
        else:
            # in flight from here (see SendService.put_records): the write runs as its own task
            # so that its result is remembered even if this request is cancelled meanwhile
            future = cache.begin(keys)
            write = asyncio.ensure_future(self._append(topic, batches, keys, future))
            write.add_done_callback(_retrieve)
            placed = await asyncio.shield(write)
        return {"batches": [[qid, first, n] for qid, first, n, _ in placed]}

    def _fresh_keys(self, topic: str, summaries: list[BatchSummary], now: int
                    ) -> list[DedupKey] | None:
        """The dedup keys of every record in request order, when none is delayed or known
        (the fast path); None when one is (``[]`` when dedup is off)."""
        if any(s.delayed for s in summaries):
            return None
        sender = self.sender
        cache = sender.dedup
        if not cache.enabled:  # one id twice still takes the rare path (same content?)
            ids = [mid for s in summaries for mid in s.message_ids]
            return [] if len(set(ids)) == len(ids) else None
        cache.expire(now)
        keys = [(topic, mid) for s in summaries for mid in s.message_ids]
        if not cache.unknown(keys, now) or len(set(keys)) != len(keys):
            return None  # known, being stored, or twice in the request
        if cache.needs_index(now):
            indexed = sender.indexed
            if any(indexed(key, now) is not None for key in keys):
                return None
        return keys

    async def _append(self, topic: str, batches: list[Batch],
                      keys: list[DedupKey] | None = None, future: Any = None) -> list[Run]:
        """One group commit of ``batches``; per batch (queue, first offset, count, stored ms).
        Settles the dedup ``future`` of ``keys`` (the places, or the error)."""
        from tidemq_server.broker.messaging.send import appended_or_raise
        sender = self.sender
        cache = sender.dedup
        count = sum(b.summary.head.count for b in batches)
        started = time.perf_counter()
        try:
            result = await sender.appender.append_batches(batches)
            sender.metrics.observe_put_of(topic, count, sum(
                b.summary.payload_bytes for b in batches), result.status,
                time.perf_counter() - started)
            if result.status is not PutStatus.OK:
                # the batches may be in the log unacknowledged: a retry must find them there
                cache.mark_incomplete(now_ms())
            appended = appended_or_raise(result)
        except BaseException as exc:
            if keys:
                err = exc if isinstance(exc, ProtocolError) else ProtocolError(
                    ErrorCode.UNAVAILABLE, f"store write failed: {type(exc).__name__}")
                cache.finish(dict(enumerate(keys)), future, None, err)
            raise
        out = [(a.queue_id, a.queue_offset, b.summary.head.count, a.store_timestamp)
               for a, b in zip(appended, batches, strict=True)]
        if keys:
            cache.finish_runs(keys, future, out)
        return out

    async def _one_by_one(self, topic: str, raw: bytes, summaries: list[BatchSummary],
                          host: str, now: int) -> list[dict[str, Any]]:
        """The rare path: every record as a store record through ``put_records`` (delays routed,
        duplicates answered with their first result); results per message."""
        sender = self.sender
        router = sender.delay_router
        records: list[MessageRecord] = []
        ids: list[str] = []
        seen: dict[str, tuple[int, int, tuple[Any, ...]]] = {}  # id -> batch, record, content
        start = 0  # where batch b starts in the request
        for b, s in enumerate(summaries):
            for k, pos in enumerate(s.positions):
                rec = decode_record(raw, start + pos, k)
                content = (s.head.queue_id, rec.body, rec.tag, tuple(rec.keys),
                           dict(rec.properties), rec.flag, rec.delay_kind, rec.delay_value)
                first = seen.setdefault(rec.message_id, (b, k, content))
                if first[2] != content:  # as a JSON send's parse_messages refuses it
                    raise BatchError("message_id", f"{rec.message_id!r} is also batches["
                                     f"{first[0]}].records[{first[1]}], with other content: "
                                     "one id names one message", k, batch=b)
                record = MessageRecord(topic, s.head.queue_id, rec.body, store_properties(rec),
                                       rec.tag_code, rec.flag, 0, rec.born_timestamp, host)
                kind, value = rec.delay_kind, rec.delay_value
                if kind:
                    try:
                        record = router.route_record(
                            record, now, delay_level=value if kind == DelayKind.LEVEL else 0,
                            delay_ms=value if kind == DelayKind.DELAY_MS else None,
                            deliver_at_ms=value if kind == DelayKind.DELIVER_AT_MS else None)
                    except ProtocolError as exc:
                        raise BatchError("delay_value", exc.message, k, exc.code,
                                         batch=b) from None
                records.append(record)
                ids.append(rec.message_id)
            start += s.head.size
        repeated: set[int] = set()
        placed = await sender.put_records(records, [True] * len(records), now, repeated)
        return sender.results(ids, placed, repeated, topic)


def check_limits(summaries: list[BatchSummary], limits: Limits) -> None:
    """The API's batch limits over every batch of a request together (413)."""
    count = sum(s.head.count for s in summaries)
    if count > limits.max_batch_messages:
        raise ProtocolError(ErrorCode.MESSAGE_TOO_LARGE, f"batches: {count} messages "
                            f"exceeds the batch limit of {limits.max_batch_messages}")
    payload = sum(s.payload_bytes for s in summaries)
    if payload > limits.max_batch_bytes:
        raise ProtocolError(ErrorCode.MESSAGE_TOO_LARGE, f"batches: {payload} bytes "
                            f"(bodies and properties) exceeds the limit of "
                            f"{limits.max_batch_bytes} bytes")


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
