"""``Ingest``: the one way the broker stores a record or a batch (RocketMQ's
``CommitLog.asyncPutMessage`` is the anchor: one entry point, flush and replication behind it).

Every service that stores holds the one ``Ingest`` the composition root built (``Broker.start``);
only this class calls the ``Appender`` (store/appender.py: the group-commit writer, or the
replication gate around it). In order, a write:

1. is checked before anything is stored — by its caller, with the pure checks of
   ``checks.py`` (a batch send) and ``halves.py`` (half batches), or a service's own parse;
2. is de-duplicated when it is a send (``put_records``, ``put_batches``): a (topic, message id)
   stored within the window gets its first result again (``dedup.py``: the recent map, the
   writes in flight, the unique-key index); a first copy found in the index is settled
   (``settle``) before it is answered;
3. is appended in one group commit (``append`` / ``append_batches``); a send's write runs as
   its own task, shielded, so that its result is remembered even when the request is
   cancelled (client gone) while the store still writes it;
4. is counted (``tidemq_broker_put_*``; a send also per topic) and its outcome mapped
   (``outcome.py``): OK → where each record landed, else the client's ProtocolError; a send
   refused after it may have reached the log makes the dedup consult the index again.

Retries and cancel records are stored uncounted (``write(..., counted=False)``), as before.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar, cast

from tidemq.protocol import REAL_TOPIC, UNIQ_KEY
from tidemq.protocol.records.v2_read import BatchSummary, split

from tidemq_server.broker.ingest.dedup import DedupCache, DedupKey, Placed, Run, WriteFuture
from tidemq_server.broker.ingest.outcome import appended_or_raise, settled_or_raise, write_failed
from tidemq_server.broker.observability import BrokerMetrics
from tidemq_server.broker.store.appender import Appender
from tidemq_server.broker.store.records import v1 as v1
from tidemq_server.broker.store.records.v2_own import Batch, encode_records
from tidemq_server.broker.store.store import MessageStore
from tidemq_server.broker.store.types import (
    Appended,
    MessageRecord,
    PutResult,
    PutStatus,
    StoredRecord,
)
from tidemq_server.broker.store.writer import RECORDS_BATCH_BYTES
from tidemq_server.common.clock import now_ms

T = TypeVar("T")
#: ``(real queue id, due ms)`` of a delayed message's waiting copy, None for any other record
#: (``DelayRouter.waiting``, handed in by the composition root).
Waiting = Callable[["MessageRecord | StoredRecord"], "tuple[int, int] | None"]


class Ingest:
    def __init__(self, store: MessageStore, appender: Appender, dedup: DedupCache,
                 metrics: BrokerMetrics, waiting: Waiting) -> None:
        self.store = store  # reads only (the unique-key index, segment size)
        self.appender = appender
        self.dedup = dedup
        self.metrics = metrics
        self.waiting = waiting

    # --- plain writes -----------------------------------------------------------------------

    async def write(self, records: list[MessageRecord], *, counted: bool = True
                    ) -> list[Appended]:
        """One store write; ProtocolError (BROKER_BUSY, DISK_FULL, ...) when it fails.
        ``counted``: in ``tidemq_broker_put_requests`` and ``put_latency``."""
        if not counted:
            return appended_or_raise(await self.appender.append(records))
        started = time.perf_counter()
        result = await self.appender.append(records)
        self._count(result, started)
        return appended_or_raise(result)

    async def write_batches(self, batches: list[Batch], records: Sequence[MessageRecord] = ()
                            ) -> list[Appended]:
        """Producer-made ``batches`` as they came, then ``records`` (encoded as batches), in
        one group commit; one ``Appended`` per batch."""
        if records:
            extra, _ = encode_records(list(records), self.batch_bytes)
            batches = [*batches, *extra]
        started = time.perf_counter()
        result = await self.appender.append_batches(batches)
        self._count(result, started)
        return appended_or_raise(result)

    @property
    def batch_bytes(self) -> int:
        """The most a batch the broker makes may hold: it always fits a segment."""
        return min(RECORDS_BATCH_BYTES, self.store.log.segment_bytes // 4)

    async def settle(self, end: int) -> None:
        """Records already in the log below ``end`` (a duplicate found there, perhaps never
        acknowledged) are acknowledged on the same terms as a fresh write (quorum, primary);
        else the ProtocolError of the refusal."""
        settled_or_raise(await self.appender.settle(end))

    @staticmethod
    def batches_of(raw: bytes, summaries: list[BatchSummary], host: str) -> list[Batch]:
        """The validated batches of a request body, to be appended as they came."""
        born = v1.encode_host(host)
        return [Batch(raw[at:at + size], s, born)
                for (at, size), s in zip(split(raw), summaries, strict=True)]

    def _count(self, result: PutResult, started: float) -> None:
        self.metrics.put_requests.labels(result.status.value).inc()
        self.metrics.put_latency.observe(time.perf_counter() - started)

    # --- sends: de-duplicated writes --------------------------------------------------------

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
            use_index = self._needs_index(now)
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
            await self.settle(settle_end)
            for key, where, stored in indexed:
                cache.remember(key, where, stored)
        if to_store and keys:
            # in flight from here: a concurrent duplicate waits for this write's result
            future = cache.begin(keys)
            await _own_task(self._store(records, to_store, placed, keys, future))
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
        batch = records if len(to_store) == len(records) else [records[i] for i in to_store]
        try:
            appended = await self._send_write(self.appender.append(batch), batch[0].topic,
                                              len(batch), sum(len(r.body) for r in batch))
        except BaseException as exc:
            if future is not None and keys:
                self.dedup.finish(keys, future, None, write_failed(exc))
            raise
        waiting = self.waiting
        stored_ms = [0] * len(records) if future is not None else []
        for i, app in zip(to_store, appended, strict=True):
            placed[i] = Placed(app.queue_id, app.queue_offset, waiting(records[i]))
            if stored_ms:
                stored_ms[i] = app.store_timestamp
        if future is not None and keys:
            self.dedup.finish(keys, future, placed, stored_ms=stored_ms)

    def fresh_keys(self, topic: str, summaries: list[BatchSummary], now: int
                   ) -> list[DedupKey] | None:
        """The dedup keys of every record of a batch send in request order, when none is
        delayed or known (the fast path); None when one is (``[]`` when dedup is off)."""
        if any(s.delayed for s in summaries):
            return None
        cache = self.dedup
        if not cache.enabled:  # one id twice still takes the rare path (same content?)
            ids = [mid for s in summaries for mid in s.message_ids]
            return [] if len(set(ids)) == len(ids) else None
        cache.expire(now)
        keys = [(topic, mid) for s in summaries for mid in s.message_ids]
        if not cache.unknown(keys, now) or len(set(keys)) != len(keys):
            return None  # known, being stored, or twice in the request
        if self._needs_index(now):
            indexed = self.indexed
            if any(indexed(key, now) is not None for key in keys):
                return None
        return keys

    async def put_batches(self, topic: str, batches: list[Batch], keys: list[DedupKey]
                          ) -> list[Run]:
        """One group commit of a send's ``batches`` whose records have the fresh ``keys``
        (``fresh_keys``); per batch (queue, first offset, count, stored ms)."""
        if not keys:
            return await self._append(topic, batches)
        # in flight from here (see put_records)
        future = self.dedup.begin(keys)
        return await _own_task(self._append(topic, batches, keys, future))

    async def _append(self, topic: str, batches: list[Batch],
                      keys: list[DedupKey] | None = None, future: Any = None) -> list[Run]:
        """Settles the dedup ``future`` of ``keys`` (the places, or the error)."""
        count = sum(b.summary.head.count for b in batches)
        try:
            appended = await self._send_write(self.appender.append_batches(batches), topic,
                                              count, sum(b.summary.payload_bytes
                                                         for b in batches))
        except BaseException as exc:
            if keys:
                self.dedup.finish(dict(enumerate(keys)), future, None, write_failed(exc))
            raise
        out = [(a.queue_id, a.queue_offset, b.summary.head.count, a.store_timestamp)
               for a, b in zip(appended, batches, strict=True)]
        if keys:
            self.dedup.finish_runs(keys, future, out)
        return out

    async def _send_write(self, put: Awaitable[PutResult], topic: str, count: int,
                          nbytes: int) -> list[Appended]:
        """A send's append, counted per topic; a refusal may have left records in the log
        unacknowledged, so the dedup looks there for a retry."""
        started = time.perf_counter()
        result = await put
        self.metrics.observe_put_of(topic, count, nbytes, result.status,
                                    time.perf_counter() - started)
        if result.status is not PutStatus.OK:
            self.dedup.mark_incomplete(now_ms())
        return appended_or_raise(result)

    def dedup_topic(self, record: MessageRecord | StoredRecord) -> str:
        """The topic a message id is de-duplicated in: a waiting (delayed) copy's real topic,
        so that a retry sent after the due time — stored in the real topic at once — finds
        the waiting copy of its first attempt (the faults suite saw both delivered)."""
        return (record.properties[REAL_TOPIC] if self.waiting(record) else record.topic)

    def _needs_index(self, now: int) -> bool:
        """Whether the dedup check must ask the store's index; once it need not (the first
        window after the start is over), the index stops feeding its recent-key filter, which
        only that window's lookups use (store/keyfilter.py)."""
        if self.dedup.needs_index(now):
            return True
        self.store.stop_tracking_recent_keys()
        return False

    def indexed(self, key: DedupKey, now: int) -> tuple[Placed, int, int] | None:
        """The first copy of ``key`` in the store's unique-key index within the window, its
        store time and its end offset. The whole log counts, above the high-water mark too: a
        promoted replica keeps what it copied, and a write answered NOT_ENOUGH_REPLICAS stays
        in the log."""
        topic, mid = key
        horizon = now - self.dedup.window_ms
        for rec in self.store.find_by_unique_key(mid, whole_log=True, since_ms=horizon):
            if self.dedup_topic(rec) == topic and rec.store_timestamp >= horizon:
                where = Placed(rec.queue_id, rec.queue_offset, self.waiting(rec))
                return where, rec.store_timestamp, rec.physical_offset + rec.size
        return None


async def _own_task(write: Coroutine[Any, Any, T]) -> T:
    """Run ``write`` as its own task and wait for it shielded: a cancelled request leaves the
    write running to its end (its result remembered, its error handed to the waiters)."""
    task = asyncio.ensure_future(write)
    task.add_done_callback(_retrieve)
    return await asyncio.shield(task)


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a write's error as seen: its request may be gone (the error went to the waiters)."""
    if not task.cancelled():
        task.exception()
