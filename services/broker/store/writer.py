"""Group commit: the store's single writer.

Concurrent ``put`` calls enqueue requests; one task drains the queue, puts every waiting
entry into one buffer, writes it with one ``pwrite``, dispatches the records and wakes
long-pollers. Every entry is a record format v2 batch (``tidemq.protocol.records.v2``): a
producer's batch as it arrived (``append_batches``), or the batches ``append`` encodes a put's
records into (``store/records/v2_own.py``). The writer fills each batch's broker part (physical
offset, queue offset of its first record, store time, hosts) in place, seals its header CRC
and dispatches it from its summary.

Under ``flush=async`` requests are acknowledged once the write returns (the data is in the
OS, so a process crash loses nothing acknowledged). Under ``flush=sync`` a second task runs
``fdatasync`` in a thread while the writer keeps packing the next batch, and acknowledges
every request the sync covered — one fsync serves hundreds of records.

The writer is the store's ``Appender`` (store/appender.py): the broker's services write through
``append`` / ``append_batches``, directly or through the replication gate that wraps it.

Flow control: when the queue's head has waited longer than ``max_send_wait_ms`` or the bytes
waiting exceed ``max_pending_bytes``, ``append`` answers BUSY at once instead of queueing; while
``disk.full`` (store/retention.py, ``DiskSpace``) it answers DISK_FULL.

Failures: ``append`` encodes every record before queueing it, so a record the layout cannot
hold (a field past its slot's width) fails its own request (INVALID) and never reaches a
write. An error inside the writer task is a bug or an I/O failure: it is sticky (the commit
log's ``error``, set through ``CommitLog.fail``), every later append answers UNAVAILABLE, and
the broker's /healthz reports it.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tidemq.protocol.records.v2 import fill

from tidemq_server.broker.store.commitlog import CommitLog, StoreClosedError
from tidemq_server.broker.store.config import FlushMode, StoreConfig
from tidemq_server.broker.store.consume_queue import ConsumeQueue
from tidemq_server.broker.store.dispatcher import Dispatcher, dispatchable
from tidemq_server.broker.store.records import v1 as record
from tidemq_server.broker.store.records.v2_own import Batch, encode_records
from tidemq_server.broker.store.retention import DiskSpace
from tidemq_server.broker.store.types import Appended, MessageRecord, PutResult, PutStatus

log = logging.getLogger(__name__)

WRITE_BATCH_BYTES = 4 * 1024 * 1024  # at most this much is packed into one write
RECORDS_BATCH_BYTES = 1024 * 1024  # a put's records share v2 batches of at most this much
DISK_FULL_TEXT = ("disk is nearly full and nothing can be deleted; writes resume once space "
                  "returns")


@dataclass(slots=True, eq=False)
class _Request:
    batches: list[Batch]  # format v2, broker part still zero
    where: list[tuple[int, int]] | None  # per record (batch, ordinal); None: answer per batch
    nbytes: int
    enqueued: float
    future: asyncio.Future[PutResult]
    result: PutResult | None = None


@dataclass(slots=True)
class _SyncWait:
    end_offset: int
    requests: list[_Request]
    since: float = field(default_factory=time.monotonic)


def fsync_all(fds: list[int]) -> None:
    for fd in fds:
        os.fdatasync(fd)


class GroupCommitWriter:
    def __init__(self, config: StoreConfig, commitlog: CommitLog, dispatcher: Dispatcher,
                 notify: Callable[[set[tuple[str, int]]], None],
                 sync_lock: asyncio.Lock, disk: DiskSpace) -> None:
        self.config = config
        self.log = commitlog
        self.dispatcher = dispatcher
        self.notify = notify
        self.sync_lock = sync_lock
        self.disk = disk  # DISK_FULL while disk.full
        self.store_host = record.encode_host(config.store_host)
        # a put's records are cut into batches that always fit a segment
        self.max_batch_bytes = min(RECORDS_BATCH_BYTES, config.segment_bytes // 4)
        self.closed = False
        self._queue: deque[_Request] = deque()
        self._pending_bytes = 0
        self._wake = asyncio.Event()
        self._sync_waits: deque[_SyncWait] = deque()
        self._sync_wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.stats = {"put_requests": 0, "put_records": 0, "put_bytes": 0, "writes": 0,
                      "fsyncs": 0, "busy": 0}

    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._write_loop(), name="store-writer"))
        if self.config.flush == FlushMode.SYNC:
            self._tasks.append(asyncio.create_task(self._sync_loop(), name="store-sync"))

    async def stop(self) -> None:
        """Refuse new appends, finish the queued ones, then stop."""
        self.closed = True
        while self._queue or self._sync_waits:
            self._wake.set()
            self._sync_wake.set()
            await asyncio.sleep(0.001)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # --- the append path -------------------------------------------------------------------
    def _refusal(self, now: float) -> PutResult | None:
        if self.closed or self.log.error:
            return PutResult(PutStatus.UNAVAILABLE, message=self.log.error or "store is closing")
        if self.disk.full:
            return PutResult(PutStatus.DISK_FULL, message=DISK_FULL_TEXT)
        waited = (now - self._queue[0].enqueued) if self._queue else 0.0
        if self._sync_waits:
            waited = max(waited, now - self._sync_waits[0].since)
        if waited * 1000 > self.config.max_send_wait_ms:
            return PutResult(PutStatus.BUSY, message=f"write queue head waited "
                             f"{waited * 1000:.0f} ms (limit {self.config.max_send_wait_ms} ms)")
        if self._pending_bytes > self.config.max_pending_bytes:
            return PutResult(PutStatus.BUSY, message=f"{self._pending_bytes} bytes waiting to be "
                             f"written (limit {self.config.max_pending_bytes})")
        return None

    async def settle(self, end: int) -> PutStatus:
        """One copy of the log: what is written is acknowledged as it is (``Appender``)."""
        return PutStatus.OK

    async def append(self, records: list[MessageRecord]) -> PutResult:
        """Queue ``records`` for the next batch; answered once written (``flush=async``) or
        once the fsync covering them returned (``flush=sync``). The result has one
        ``Appended`` per record, in order."""
        refusal = self._refused()
        if refusal is not None:
            return refusal
        try:  # a record the layout cannot hold fails its own request here, never the writer
            batches, where = encode_records(records, self.max_batch_bytes)
        except (ValueError, TypeError) as exc:
            return PutResult(PutStatus.INVALID, message=str(exc))
        return await self._enqueue(batches, where)

    async def append_batches(self, batches: list[Batch]) -> PutResult:
        """Queue producer-made v2 batches (validated, broker part zero) for the next write;
        the result has one ``Appended`` per batch: where it starts, its size and the queue
        offset of its first record."""
        refusal = self._refused()
        if refusal is not None:
            return refusal
        return await self._enqueue(batches, None)

    def _refused(self) -> PutResult | None:
        refusal = self._refusal(time.monotonic())
        if refusal is not None and refusal.status == PutStatus.BUSY:
            self.stats["busy"] += 1
        return refusal

    async def _enqueue(self, batches: list[Batch], where: list[tuple[int, int]] | None
                       ) -> PutResult:
        nbytes = largest = 0
        for b in batches:
            n = len(b.raw)
            nbytes += n
            largest = max(largest, n)
        if largest + record.BLANK_SIZE > self.log.segment_bytes:
            return PutResult(PutStatus.TOO_LARGE, message=f"a {largest}-byte batch cannot fit "
                             f"a {self.log.segment_bytes}-byte segment")
        fut: asyncio.Future[PutResult] = asyncio.get_running_loop().create_future()
        self._queue.append(_Request(batches, where, nbytes, time.monotonic(), fut))
        self._pending_bytes += nbytes
        self._wake.set()
        return await fut

    # --- the writer task -------------------------------------------------------------------
    async def _write_loop(self) -> None:
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            batch: list[_Request] = []
            nbytes = 0
            while self._queue and (not batch or nbytes < WRITE_BATCH_BYTES):
                req = self._queue.popleft()
                batch.append(req)
                nbytes += req.nbytes
            try:
                if self.disk.short(nbytes):  # refused whole, before a byte is written
                    self.disk.full = True
                    log.error("disk nearly full: refusing writes until space returns")
                    self._finish(batch, PutResult(PutStatus.DISK_FULL, message=DISK_FULL_TEXT))
                    continue
                self._write_batch(batch)
                touched = self.dispatcher.write_pending()
            except StoreClosedError as exc:
                self._finish(batch, PutResult(PutStatus.UNAVAILABLE, message=str(exc)))
                continue
            except Exception as exc:  # a bug or a failing disk: sticky, never write past it
                log.exception("store writer failed")
                reason = f"writer failed: {exc}"
                self.log.fail(reason)
                if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                    self.disk.full = True
                self._finish(batch, PutResult(PutStatus.WRITE_FAILED, message=reason))
                continue
            if touched:
                self.notify(touched)
            if self.config.flush == FlushMode.SYNC:
                self._sync_waits.append(_SyncWait(self.log.write_offset, batch))
                self._sync_wake.set()
            else:
                self._finish(batch)
            await asyncio.sleep(0)  # let the callers just woken enqueue their next puts

    def _finish(self, batch: list[_Request], failure: PutResult | None = None) -> None:
        for req in batch:
            self._pending_bytes -= req.nbytes
            if not req.future.done():
                req.future.set_result(failure or req.result)  # type: ignore[arg-type]

    def _write_batch(self, batch: list[_Request]) -> None:
        clog, disp = self.log, self.dispatcher
        fits, dispatch_batch, queue = clog.fits, disp.dispatch_batch, disp.queue
        store_host = self.store_host
        now_ms = int(time.time() * 1000)
        buf = bytearray()
        base = clog.write_offset  # where buf starts in the log
        queues: dict[tuple[str, int], ConsumeQueue] = {}  # looked up once per batch
        records = 0
        for req in batch:
            placed: list[Appended] = []
            for b in req.batches:
                raw, summary = b.raw, b.summary
                head = summary.head
                size = len(raw)
                if not fits(len(buf) + size):
                    if buf:
                        clog.write(buf)
                        buf = bytearray()
                    clog.roll()
                    base = clog.write_offset
                phys = base + len(buf)
                topic, queue_id = head.topic, head.queue_id
                if dispatchable(head.sys_flag):
                    cq = queues.get((topic, queue_id))
                    if cq is None:
                        cq = queues[(topic, queue_id)] = queue(topic, queue_id)
                    qoff = cq.max_offset
                else:
                    qoff = 0  # a batch with no consume-queue units
                at = len(buf)
                buf += raw
                fill(buf, at, phys, qoff, now_ms, store_host, b.born_host)
                head.base_physical, head.base_queue_offset = phys, qoff
                head.store_timestamp, head.store_host, head.born_host = (now_ms, store_host,
                                                                         b.born_host)
                dispatch_batch(summary)
                placed.append(Appended(phys, size, queue_id, qoff, now_ms))
                records += head.count
            if req.where is None:
                req.result = PutResult(PutStatus.OK, placed)
            else:  # one answer per record, in the request's order
                req.result = PutResult(PutStatus.OK, [
                    Appended(placed[k].physical_offset + req.batches[k].summary.positions[i],
                             req.batches[k].summary.sizes[i], placed[k].queue_id,
                             placed[k].queue_offset + i, now_ms)
                    for k, i in req.where])
        stats = self.stats
        stats["put_records"] += records
        stats["put_bytes"] += sum(req.nbytes for req in batch)
        stats["put_requests"] += len(batch)
        stats["writes"] += 1
        if buf:
            clog.write(buf)

    # --- the sync task (flush=sync) --------------------------------------------------------
    async def _sync_loop(self) -> None:
        while True:
            if not self._sync_waits:
                self._sync_wake.clear()
                await self._sync_wake.wait()
                continue
            try:
                async with self.sync_lock:
                    target, fds = self.log.take_dirty()
                    await asyncio.to_thread(fsync_all, fds)
                    self.log.mark_synced(target)
                    self.stats["fsyncs"] += 1
            except OSError as exc:
                reason = f"fsync failed: {exc}"
                self.log.fail(reason)
                log.error("%s; the store refuses further writes", reason)
                while self._sync_waits:
                    self._finish(self._sync_waits.popleft().requests,
                                 PutResult(PutStatus.WRITE_FAILED, message=reason))
                continue
            while self._sync_waits and self._sync_waits[0].end_offset <= target:
                self._finish(self._sync_waits.popleft().requests)
