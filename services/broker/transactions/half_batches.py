"""Half messages as producer-made batches: ``POST /v1/transactions?producer_group=&topic=`` with
``application/x-tidemq-batch`` (record format v2, ``tidemq.protocol.records.v2``).

The SDK builds each half record as the log stores a half copy: topic ``RMQ_SYS_TRANS_HALF_TOPIC``,
queue 0, sys_flag 0 (a half copy is dispatched into the half queue the checker walks), and the
reserved properties of a half copy — ``TRAN_MSG`` ("true"), ``PGROUP`` (the request's group),
``REAL_TOPIC`` (the request's topic), ``REAL_QID`` (one of its queues), ``TRANSACTION_ID`` (an id
the producer made: new, 1-64 letters, digits, ``-`` or ``_``) and optionally
``CHECK_IMMUNITY_TIME_IN_SECONDS`` — with the transaction id among its keys (so
``find_by_key(HALF, txid)`` finds it). No other reserved property, no delay (a delayed half goes
as JSON/msgpack), no ends riding along. ``BORN_MS`` is not carried: a half copy without it is
born when it was stored (``model.born_ms_of``).

In order: every batch and record is checked before anything is stored (a 400 names the batch,
the record and the field); under the message-id locks, the common case — no message id seen in
the dedup window, every transaction id new — appends the batches as they are together with the
``half`` events (one group commit); a retried half (a message id stored within the window)
answers its first transaction id and the rest are re-encoded (the rare path).
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

from tidemq.protocol import (
    BORN_MS,
    CHECK_IMMUNITY_TIME_IN_SECONDS,
    KEYS,
    PGROUP,
    REAL_QID,
    REAL_TOPIC,
    SHARDING_KEY,
    TAGS,
    TRAN_MSG,
    TRANSACTION_ID,
    UNIQ_KEY,
    ErrorCode,
    EventKind,
    EventSource,
    ProtocolError,
    validate_group_name,
)
from tidemq.protocol.numbers import INT32_MAX
from tidemq.protocol.records.v2 import KEY_SEPARATOR, RECORD, RECORD_FIXED, decode_properties
from tidemq.protocol.records.v2_read import BatchError, BatchSummary, split, validate

from tidemq_server.broker.messaging.intake import check_limits
from tidemq_server.broker.messaging.send import appended_or_raise
from tidemq_server.broker.store.index import topic_key
from tidemq_server.broker.store.records import v1 as v1
from tidemq_server.broker.store.records.v2_own import Batch, encode_records
from tidemq_server.broker.store.types import Appended, MessageRecord, PutResult
from tidemq_server.broker.store.writer import RECORDS_BATCH_BYTES
from tidemq_server.broker.transactions.model import HALF_TOPIC, TxInfo, event_record
from tidemq_server.common.clock import now_ms

if TYPE_CHECKING:
    from tidemq_server.broker.transactions.service import TransactionService

#: The reserved properties a half record may carry (and the sharding key any send may).
HALF_PROPERTIES = frozenset({TRAN_MSG, PGROUP, REAL_TOPIC, REAL_QID, TRANSACTION_ID,
                             CHECK_IMMUNITY_TIME_IN_SECONDS, SHARDING_KEY})
_REQUIRED = (TRAN_MSG, PGROUP, REAL_TOPIC, REAL_QID, TRANSACTION_ID)
_TXID = re.compile(r"[A-Za-z0-9_-]{1,64}")


class BatchHalf:
    """A half record of a producer's batch, as its checks read it: enough to answer it and, as
    long as it is pending, to build its commit copy without decoding it again."""

    __slots__ = ("at", "batch", "body", "born_timestamp", "flag", "host", "index",
                 "message_id", "properties", "size", "txid")

    def __init__(self, batch: int, index: int, at: int, message_id: str, txid: str,
                 properties: dict[str, str], body: bytes, flag: int, born_timestamp: int
                 ) -> None:
        self.batch, self.index, self.at = batch, index, at
        self.message_id, self.txid, self.properties = message_id, txid, properties
        self.body, self.flag, self.born_timestamp = body, flag, born_timestamp
        self.size, self.host = 0, ""  # where it landed: set once stored

    def record(self) -> MessageRecord:
        """The half copy as a store record (``properties`` carries id, tag and keys)."""
        return MessageRecord(HALF_TOPIC, 0, self.body, dict(self.properties), 0, self.flag, 0,
                             self.born_timestamp, self.host)


class HalfBatches:
    """``TransactionService.begin_batches``: one request of half batches."""

    def __init__(self, tx: TransactionService) -> None:
        self.tx = tx

    async def begin(self, group: str | None, topic: str | None, raw: bytes, host: str
                    ) -> dict[str, Any]:
        tx = self.tx
        tx.require_enabled()
        if group is None:
            raise ProtocolError(ErrorCode.BAD_REQUEST, "producer_group is required (a query "
                                "parameter with a batch body)")
        group = validate_group_name(group)
        if topic is None:
            raise ProtocolError(ErrorCode.BAD_REQUEST, "topic is required (a query parameter "
                                "with a batch body)")
        cfg = await tx.sender.writable_topic(topic)
        summaries, halves = self.parse(group, topic, raw, cfg.queues)
        await tx.ensure_topics()
        now = now_ms()
        taken = await tx.locks.acquire([*("m\0" + h.message_id for h in halves),
                                        *(h.txid for h in halves)])
        try:
            txids = await self._store(group, topic, raw, summaries, halves, host, now)
        finally:
            tx.locks.release(taken)
        if all(t == h.txid for t, h in zip(txids, halves, strict=True)):
            return {"stored": len(halves)}  # every record's own id stands (the common case)
        return {"transactions": [{"transaction_id": t, "message_id": h.message_id}
                                 for t, h in zip(txids, halves, strict=True)]}

    # --- checks (nothing stored yet) --------------------------------------------------------

    def parse(self, group: str, topic: str, raw: bytes, queues: int
              ) -> tuple[list[BatchSummary], list[BatchHalf]]:
        limits = self.tx.sender.limits
        summaries: list[BatchSummary] = []
        halves: list[BatchHalf] = []
        seen: dict[str, int] = {}
        for k, (at, size) in enumerate(split(raw)):
            try:
                s = validate(raw, at, strict=True, allowed=HALF_PROPERTIES, limits=limits,
                             end=at + size)
                head = s.head
                if head.topic != HALF_TOPIC:
                    raise BatchError("topic", f"{head.topic!r}: half messages go to "
                                     f"{HALF_TOPIC!r}")
                if head.queue_id != 0:
                    raise BatchError("queue_id", f"{head.queue_id}: the half queue is 0")
                if head.sys_flag:
                    raise BatchError("sys_flag", f"{head.sys_flag}: a half copy is stored "
                                     "with 0")
                if s.delayed:
                    raise BatchError("delay_kind", "a delayed half message goes as JSON or "
                                     "msgpack", s.delayed[0])
                for i, pos in enumerate(s.positions):
                    half = self._check_record(raw, k, i, at + pos, group, topic, queues,
                                              s.message_ids[i], s.keys[i])
                    if half.txid in seen:
                        raise BatchError("properties.TRANSACTION_ID", f"{half.txid!r} is "
                                         f"also record {seen[half.txid]} of this request", i)
                    seen[half.txid] = len(halves)
                    halves.append(half)
            except BatchError as exc:
                raise BatchError(exc.field, exc.why, exc.index, exc.code, batch=k) from None
            summaries.append(s)
        if not summaries:
            raise ProtocolError(ErrorCode.BAD_REQUEST, "the body holds no batch")
        check_limits(summaries, limits)
        return summaries, halves

    def _check_record(self, raw: bytes, batch: int, i: int, p: int, group: str, topic: str,
                      queues: int, message_id: str, keys: str) -> BatchHalf:
        """The half record at ``raw[p:]`` (validated), its reserved properties checked."""
        (_, _, _, _, flag, _, born, _, _, _, _, id_len, tag_len, keys_len, props_len,
         body_len) = RECORD.unpack_from(raw, p)
        tag_at = p + RECORD_FIXED + id_len
        at = tag_at + tag_len + keys_len
        view = memoryview(raw)
        props = decode_properties(view[at:at + props_len])  # utf-8: validated
        for name in _REQUIRED:
            if name not in props:
                raise BatchError(f"properties.{name}", "missing: a half record carries "
                                 f"{', '.join(_REQUIRED)}", i)
        if props[TRAN_MSG] != "true":
            raise BatchError(f"properties.{TRAN_MSG}", f"{props[TRAN_MSG]!r}, must be 'true'",
                             i)
        if props[PGROUP] != group:
            raise BatchError(f"properties.{PGROUP}", f"{props[PGROUP]!r}, but the request is "
                             f"for producer group {group!r}", i)
        if props[REAL_TOPIC] != topic:
            raise BatchError(f"properties.{REAL_TOPIC}", f"{props[REAL_TOPIC]!r}, but the "
                             f"request is for topic {topic!r}", i)
        qid = props[REAL_QID]
        if not (qid.isdigit() and qid.isascii() and int(qid) < queues):
            raise BatchError(f"properties.{REAL_QID}", f"{qid!r} is not a queue of topic "
                             f"{topic!r} (0-{queues - 1})", i)
        txid = props[TRANSACTION_ID]
        if not _TXID.fullmatch(txid):
            raise BatchError(f"properties.{TRANSACTION_ID}", f"{txid!r}: 1-64 letters, "
                             "digits, '-' or '_'", i)
        if txid not in keys.split(KEY_SEPARATOR):
            raise BatchError("keys", f"must include the transaction id {txid!r}", i)
        immunity = props.get(CHECK_IMMUNITY_TIME_IN_SECONDS)
        if immunity is not None:
            try:
                value = float(immunity)
            except ValueError:
                value = -1.0
            if not 0 <= value <= INT32_MAX:  # NaN fails too
                raise BatchError(f"properties.{CHECK_IMMUNITY_TIME_IN_SECONDS}",
                                 f"{immunity!r}: a number of seconds from 0 to {INT32_MAX}", i)
        props[UNIQ_KEY] = message_id  # as a store record holds them (entry.store_properties)
        if tag_len:
            props[TAGS] = str(view[tag_at:tag_at + tag_len], "utf-8")
        if keys:
            props[KEYS] = keys
        body_at = at + props_len
        return BatchHalf(batch, i, p, message_id, txid, props, raw[body_at:body_at + body_len],
                         flag, born)

    # --- storing ----------------------------------------------------------------------------

    def _in_use(self, txid: str) -> bool:
        """Does a transaction ``txid`` exist already (memory, else the half queue's index)?"""
        tx = self.tx
        if tx.table.get(txid) is not None:
            return True
        return bool(tx.store.index.lookup(topic_key(HALF_TOPIC, txid))) \
            and tx.table.ensure(txid) is not None

    async def _store(self, group: str, topic: str, raw: bytes, summaries: list[BatchSummary],
                     halves: list[BatchHalf], host: str, now: int) -> list[str]:
        tx = self.tx
        known: dict[int, str] = {}  # half → the transaction id its message id has already
        settle = 0
        for n, h in enumerate(halves):
            found = tx.dedup.lookup(topic, h.message_id, now)
            if found is not None:
                known[n] = found[0]
                settle = max(settle, found[1])
            elif self._in_use(h.txid):
                raise BatchError("properties.TRANSACTION_ID", f"{h.txid!r} is already in use "
                                 "by another transaction", h.index, batch=h.batch)
        if settle:  # acknowledged on the same terms as a fresh write (quorum, primary)
            appended_or_raise(PutResult(await tx.appender.settle(settle)))
        fresh = [h for n, h in enumerate(halves) if n not in known]
        infos = [TxInfo(txid=h.txid, message_id=h.message_id, group=group, topic=topic,
                        first_offset=-1, latest_offset=-1, latest_size=0, check_times=0,
                        born_ms=now) for h in fresh]
        events = [event_record(EventKind.HALF, EventSource.PRODUCER, i, now) for i in infos]
        try:
            if not known:
                places = await self._append_as_sent(raw, summaries, events, host)
            elif fresh:
                places = await self._append_decoded(fresh, events, host)
            else:
                places = []
        except ProtocolError:
            tx.dedup.mark_incomplete(now)  # the halves may be in the log: a retry looks
            raise
        for h, info, (offset, size, stored_ms) in zip(fresh, infos, places, strict=True):
            info.first_offset = info.latest_offset = offset
            info.latest_size = size
            info.born_ms = stored_ms  # as a load from the log finds it (model.born_ms_of)
            tx.table.put(info)
            h.size, h.host = size, host
            h.properties[BORN_MS] = str(stored_ms)  # for its re-put copies (model.half_copy)
            tx.cache.add(info.txid, h)
            tx.dedup.remember(topic, info.message_id, info.txid, now)
        tx.count(events)
        return [known.get(n, h.txid) for n, h in enumerate(halves)]

    async def _append_as_sent(self, raw: bytes, summaries: list[BatchSummary],
                              events: list[MessageRecord], host: str) -> list[tuple[int, int, int]]:
        """The batches as they came and the events, in one group commit; where each half
        landed (physical offset, size)."""
        born = v1.encode_host(host)
        batches = [Batch(raw[at:at + size], s, born)
                   for (at, size), s in zip(split(raw), summaries, strict=True)]
        extra, _ = encode_records(events, min(RECORDS_BATCH_BYTES,
                                              self.tx.store.log.segment_bytes // 4))
        appended = await self._write([*batches, *extra])
        return [(a.physical_offset + pos, size, a.store_timestamp)
                for a, s in zip(appended, summaries, strict=False)
                for pos, size in zip(s.positions, s.sizes, strict=True)]

    async def _append_decoded(self, fresh: list[BatchHalf],
                              events: list[MessageRecord], host: str) -> list[tuple[int, int, int]]:
        """The rare path (some halves were retries): the fresh ones re-encoded with their
        events."""
        for h in fresh:
            h.host = host
        records = [h.record() for h in fresh]
        appended = await self.tx.write([*records, *events])
        return [(a.physical_offset, a.size, a.store_timestamp)
                for a in appended[:len(records)]]

    async def _write(self, batches: list[Batch]) -> list[Appended]:
        tx = self.tx
        started = time.perf_counter()
        result = await tx.appender.append_batches(batches)
        tx.metrics.put_requests.labels(result.status.value).inc()
        tx.metrics.put_latency.observe(time.perf_counter() - started)
        return appended_or_raise(result)
