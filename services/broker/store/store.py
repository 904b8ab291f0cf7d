"""MessageStore: the broker's store facade (commit log + consume queues + index).

The only writer of its directory. ``open`` recovers: it trusts derived data only below the
checkpoint, validates records forward from there, truncates a torn tail and re-dispatches.
While open, a checkpoint loop fsyncs everything every ``flush_interval_ms`` and a retention
loop deletes old segments (both ``Periodic`` loops, services/common/loop.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from tidemq.protocol.records.v2_read import BatchHead

from tidemq_server.broker.store import replicated
from tidemq_server.broker.store.checkpoint import Checkpoint, CorruptCheckpoint
from tidemq_server.broker.store.commitlog import CLOSED, CommitLog
from tidemq_server.broker.store.config import StoreConfig
from tidemq_server.broker.store.dispatcher import Dispatcher
from tidemq_server.broker.store.index import Index, topic_key, unique_key
from tidemq_server.broker.store.records import v1 as record
from tidemq_server.broker.store.records.entry import record_in
from tidemq_server.broker.store.records.stored import spans, stored_groups
from tidemq_server.broker.store.retention import DiskSpace, Retention
from tidemq_server.broker.store.types import (
    GetResult,
    GetStatus,
    MessageRecord,
    PutResult,
    StoredRecord,
)
from tidemq_server.broker.store.writer import GroupCommitWriter, fsync_all
from tidemq_server.common.loop import Periodic

log = logging.getLogger(__name__)

TAG_SCAN_FACTOR = 16  # with a tag filter, scan up to this many units per wanted message

Listener = Callable[[set[tuple[str, int]]], None]


class MessageStore:
    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        root = Path(config.root)
        self.root = root
        self.checkpoint_path = root / "checkpoint"
        self.log = CommitLog(root / "commitlog", config.segment_bytes)
        self.index = Index(root / "index", config.index_slots, config.index_entries)
        self.dispatcher = Dispatcher(root / "consumequeue", config.cq_units_per_file, self.index)
        self.floors: dict[str, int] = {}
        self._listeners: list[Listener] = []
        self._sync_lock = asyncio.Lock()
        self.disk = DiskSpace(root, config.disk_full_ratio, config.disk_min_free_bytes)
        self.writer = GroupCommitWriter(config, self.log, self.dispatcher, self._notify,
                                        self._sync_lock, self.disk)
        self.retention = Retention(self)
        self._loops = [
            Periodic("store-ckpt", config.flush_interval_ms / 1000, self._checkpoint_and_measure,
                     pause_first=True),
            Periodic("store-retain", config.retention_interval_s, self.retention.run_once,
                     pause_first=True)]
        self._checkpoint_job: asyncio.Future[None] | None = None  # the thread of a checkpoint
        self.recovery_seconds = 0.0
        self.recovered_records = 0
        # replication: records at or past this physical offset are not served (None: all)
        self.visible_offset: int | None = None  # see limit_reads

    # --- lifecycle -------------------------------------------------------------------------
    @classmethod
    async def open(cls, config: StoreConfig) -> MessageStore:
        store = cls(config)
        await asyncio.to_thread(store._recover)
        store.writer.start()
        for loop in store._loops:
            loop.start()
        return store

    def _recover(self) -> None:
        began = time.monotonic()
        self.root.mkdir(parents=True, exist_ok=True)
        fresh = not self.checkpoint_path.exists()
        try:
            cp = Checkpoint.load(self.checkpoint_path)
        except CorruptCheckpoint as exc:  # derived data is rebuilt from the whole log
            log.error("recovery: %s; re-dispatching the whole commit log", exc)
            cp, fresh = Checkpoint(), True
        self.floors = dict(cp.retention_floors)
        self.log.open()
        self.index.open()
        self.dispatcher.load()
        start = self.log.min_offset if fresh else max(self.log.min_offset,
                                                       min(cp.dispatched, self.log.write_offset))
        self.dispatcher.truncate_from(start)
        n = 0
        dispatched = 0
        for view, pos, phys, summary in self.log.scan(start):
            if summary is not None:  # a v2 batch
                self.dispatcher.dispatch_batch(summary)
                n += summary.head.count
            else:
                m = record.decode_meta(view, pos, phys)
                self.dispatcher.dispatch(m.topic, m.queue_id, m.queue_offset, phys, m.size,
                                         m.sys_flag, m.tag_code, m.store_timestamp, m.unique_key,
                                         m.keys)
                n += 1
            if n - dispatched >= 50_000:
                self.dispatcher.write_pending()
                dispatched = n
        self.dispatcher.write_pending()
        if self.log.scan_end < self.log.write_offset:
            log.warning("recovery: valid data ends at %d, file data at %d",
                        self.log.scan_end, self.log.write_offset)
        self.log.truncate(self.log.scan_end)
        for cq in self.dispatcher.queues.values():
            cq.advance_min(self.log.min_offset)
        _, fds = self.log.take_dirty()
        fsync_all(fds + self.dispatcher.take_dirty())
        self.index.flush()
        self._save_checkpoint(self.log.write_offset)
        self.recovered_records = n
        self.recovery_seconds = time.monotonic() - began
        log.info("store open at %s: commit log [%d, %d), %d queues, %d records re-dispatched "
                 "in %.2fs%s", self.root, self.log.min_offset, self.log.write_offset,
                 len(self.dispatcher.queues), n, self.recovery_seconds,
                 "" if fresh or cp.clean_shutdown else " (after an unclean stop)")

    def _save_checkpoint(self, offset: int, clean: bool = False) -> None:
        Checkpoint(commitlog_synced=offset, dispatched=offset,
                   timestamp_ms=int(time.time() * 1000), clean_shutdown=clean,
                   retention_floors=dict(self.floors)).save(self.checkpoint_path)

    async def checkpoint(self, clean: bool = False) -> None:
        """fsync commit log, consume queues and index, then record how far they are durable."""
        async with self._sync_lock:
            offset, fds = self.log.take_dirty()
            fds += self.dispatcher.take_dirty()
            for f in self.index.files[-2:]:
                f.write_header()
            job = asyncio.ensure_future(asyncio.to_thread(self._sync_and_save, fds, offset,
                                                          clean))
            self._checkpoint_job = job
            await asyncio.shield(job)  # a cancelled caller must not release the lock early
            self.log.mark_synced(offset)

    def _sync_and_save(self, fds: list[int], offset: int, clean: bool) -> None:
        fsync_all(fds)
        for f in self.index.files[-2:]:
            f.mm.flush()
        self._save_checkpoint(offset, clean)

    async def _checkpoint_and_measure(self) -> None:
        """Every ``flush_interval_ms``: a checkpoint, then how full the disk is (also when the
        checkpoint failed: a full disk is said in one line, and measured)."""
        try:
            await self.checkpoint()
        except OSError as exc:
            log.error("checkpoint failed (%s); retrying in %.1fs", exc,
                      self.config.flush_interval_ms / 1000)
        self.disk.refresh()

    async def close(self) -> None:
        await self.writer.stop()
        for loop in self._loops:
            await loop.stop()
        if self._checkpoint_job is not None:  # a cancelled checkpoint's thread still runs
            await asyncio.wait([self._checkpoint_job])
        if not self.log.error:
            await self.checkpoint(clean=True)
        self.dispatcher.close()
        self.index.close()
        self.log.close()

    # --- writing ---------------------------------------------------------------------------
    async def put(self, records: list[MessageRecord]) -> PutResult:
        """Append records contiguously, in order, in one group commit: the writer's own path,
        not gated. The broker's services write through the ``Appender`` their composition
        root hands them (store/appender.py), which is the replication gate in a replicated
        group."""
        return await self.writer.append(records)

    def add_listener(self, callback: Listener) -> None:
        self._listeners.append(callback)

    def _notify(self, touched: set[tuple[str, int]]) -> None:
        for cb in self._listeners:
            try:
                cb(touched)
            except Exception:
                log.exception("store listener failed")

    def set_retention_floor(self, owner: str, physical_offset: int) -> None:
        """A system consumer's progress: segments at or past it are never deleted."""
        self.floors[owner] = physical_offset

    # --- replication (services/broker/store/replicated.py) ------------------------------------
    def read_chunk(self, offset: int, max_bytes: int) -> bytes:
        """Raw whole records from ``offset`` for a replica (at most one segment)."""
        return replicated.read_chunk(self, offset, max_bytes)

    def append_replicated(self, data: bytes, at_offset: int) -> int:
        """A replica writes its primary's bytes at the same offset and dispatches them."""
        return replicated.append_chunk(self, data, at_offset)

    async def truncate(self, offset: int) -> int:
        """Cut the log and its derived data back to ``offset`` (a diverged tail). Under the
        sync lock, once a checkpoint saving in its thread is done: that one would otherwise
        write its older, longer offset after the cut's checkpoint (and race it for the
        checkpoint's temporary file)."""
        async with self._sync_lock:
            job = self._checkpoint_job
            if job is not None and not job.done():
                await asyncio.wait({job})
            return replicated.truncate(self, offset)

    async def sync_log(self) -> int:
        """fsync the commit log now; the offset it made durable."""
        async with self._sync_lock:
            target, fds = self.log.take_dirty()
            await asyncio.to_thread(fsync_all, fds)
            self.log.mark_synced(target)
            return target

    # --- reading ---------------------------------------------------------------------------
    def limit_reads(self, offset: int | None) -> None:
        """Serve no record at or past ``offset`` (the replication high-water mark; None: serve
        everything): consume-queue reads and index lookups stop there."""
        self.visible_offset = offset

    def queue_offsets(self, topic: str, queue_id: int) -> tuple[int, int]:
        cq = self.dispatcher.queues.get((topic, queue_id))
        return (cq.min_offset, cq.max_offset) if cq else (0, 0)

    def queue_ids(self, topic: str) -> list[int]:
        return sorted(q for (t, q) in self.dispatcher.queues if t == topic)

    def get(self, topic: str, queue_id: int, offset: int, max_count: int,
            tag_codes: frozenset[int] | None = None) -> GetResult:
        """Up to ``max_count`` records from ``offset`` whose tag code is in ``tag_codes``."""
        res, wanted = self._select(topic, queue_id, offset, max_count, tag_codes)
        if wanted:
            res.records = self.read_many(wanted)
        return self._judged(res)

    def get_stored(self, topic: str, queue_id: int, offset: int, max_count: int,
                   tag_codes: frozenset[int] | None = None,
                   tags: frozenset[bytes] | None = None) -> GetResult:
        """``get`` answered in stored form (``store/records/stored.py``): ``res.stored`` holds the
        selected records as the log holds them, ``res.count`` how many; ``tags`` (exact tag
        bytes) rules out tag-code collisions."""
        res, wanted = self._select(topic, queue_id, offset, max_count, tag_codes)
        if wanted:
            res.stored, res.count = stored_groups(self.log.read_bytes, wanted,
                                                  self.log.segment_bytes, tags)
        return self._judged(res)

    def _select(self, topic: str, queue_id: int, offset: int, max_count: int,
                tag_codes: frozenset[int] | None) -> tuple[GetResult, list[tuple[int, int]]]:
        """The consume-queue walk of a read: a result with its offsets and status so far, and
        the ``(offset, size)`` of the records to read."""
        cq = self.dispatcher.queues.get((topic, queue_id))
        lo, hi = (cq.min_offset, cq.max_offset) if cq else (0, 0)
        if offset > hi:
            return GetResult(GetStatus.OFFSET_OVERFLOW, [], offset, lo, hi), []
        corrected = offset < lo
        offset = max(offset, lo)
        if cq is None or offset == hi:
            return GetResult(GetStatus.NO_MESSAGE, [], offset, lo, hi), []
        scan = max_count if tag_codes is None else max_count * TAG_SCAN_FACTOR
        units = cq.read_units(offset, min(scan, 65_536))
        wanted: list[tuple[int, int]] = []
        nbytes = 0
        next_offset = offset
        min_phys = self.log.min_offset
        limit = self.visible_offset
        held = False
        for phys, size, tag in units:
            if len(wanted) >= max_count or nbytes >= self.config.max_read_bytes:
                break
            if limit is not None and phys >= limit:
                held = True  # not yet held by the in-sync quorum: as if not written yet
                break
            next_offset += 1
            if size <= 0 or phys < min_phys:
                continue
            if tag_codes is not None and tag not in tag_codes:
                continue
            wanted.append((phys, size))
            nbytes += size
        if held:
            hi = next_offset  # consumers see the queue end at the high-water mark
        status = (GetStatus.OFFSET_TOO_SMALL if corrected else
                  GetStatus.NO_MESSAGE if held and next_offset == offset else
                  GetStatus.NO_MATCHED)  # FOUND once records are read (_judged)
        return GetResult(status, [], next_offset, lo, hi), wanted

    @staticmethod
    def _judged(res: GetResult) -> GetResult:
        if res.status is GetStatus.NO_MATCHED and res.found:
            res.status = GetStatus.FOUND
        return res

    def read(self, physical_offset: int) -> StoredRecord | None:
        return self.log.read(physical_offset)

    def read_many(self, spots: list[tuple[int, int]]) -> list[StoredRecord]:
        """Records at ``(offset, size)`` spots (ascending); nearby ones share one pread."""
        out: list[StoredRecord] = []
        read_bytes = self.log.read_bytes
        heads: dict[int, BatchHead] = {}  # v2 batch headers by offset, for this call
        i = 0
        for start, end, j in spans(spots, self.log.segment_bytes):
            buf = read_bytes(start, end - start)
            for phys, _ in spots[i:j]:
                try:
                    out.append(record_in(buf, phys - start, phys, read_bytes, heads))
                except (record.CorruptRecord, UnicodeDecodeError, ValueError) as exc:
                    log.error("refusing to serve record at %d: %s", phys, exc)
            i = j
        return out

    def _verified(self, offsets: list[int], keep: Callable[[StoredRecord], bool],
                  whole_log: bool = False) -> list[StoredRecord]:
        out = []
        limit = None if whole_log else self.visible_offset
        for phys in sorted(offsets):
            if limit is not None and phys >= limit:
                continue
            rec = self.log.read(phys)
            if rec is not None and keep(rec):
                out.append(rec)
        return out

    def find_by_unique_key(self, message_id: str, *, whole_log: bool = False,
                           since_ms: int | None = None) -> list[StoredRecord]:
        """Every record whose message id is ``message_id``, oldest first: below the
        high-water mark (what readers may see), or in the ``whole_log`` this copy keeps — what
        a write decision (dedup, "already committed / delivered?") must consult, since a
        promoted replica keeps records above its high-water mark. ``since_ms``: the caller
        needs only records stored at or after it (it may get older ones too), which lets the
        index's recent-key filter answer most such lookups without reading the index."""
        key = unique_key(message_id)
        if since_ms is not None and self.index.surely_absent(key, since_ms):
            return []
        offsets = self.index.lookup(key)
        if not offsets:  # the usual answer while sends check for duplicates
            return []
        return self._verified(offsets, lambda r: r.message_id == message_id, whole_log)

    def track_recent_keys(self, since_ms: int) -> bool:
        """Answer ``find_by_unique_key(..., since_ms=T)`` for T >= ``since_ms`` from a bitmap
        of the keys indexed since then when it can (index.py, keyfilter.py); False when the
        index holds too many such keys to read them now."""
        return self.index.track_recent(since_ms)

    def stop_tracking_recent_keys(self) -> None:
        """Drop the recent-key filter (no more lookups with ``since_ms`` will come soon);
        later lookups read the index, as without it."""
        self.index.filter = None

    def find_by_key(self, topic: str, key: str, begin_ms: int = 0, end_ms: int = 2**62,
                    max_count: int = 64) -> list[StoredRecord]:
        offsets = self.index.lookup(topic_key(topic, key), begin_ms, end_ms)
        found = self._verified(offsets, lambda r: r.topic == topic and key in r.keys
                               and begin_ms <= r.store_timestamp <= end_ms)
        return found[-max_count:]

    def offset_for_time(self, topic: str, queue_id: int, ts_ms: int) -> int:
        """The first queue offset whose record was stored at or after ``ts_ms``."""
        cq = self.dispatcher.queues.get((topic, queue_id))
        if cq is None:
            return 0
        lo, hi = cq.min_offset, cq.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            unit = cq.read_units(mid, 1)
            ts = self.log.store_timestamp(unit[0][0]) if unit else None
            if ts is not None and ts < ts_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def find_by_time(self, topic: str, begin_ms: int, end_ms: int, max_count: int = 64
                     ) -> list[StoredRecord]:
        found: list[StoredRecord] = []
        for qid in self.queue_ids(topic):
            offset = self.offset_for_time(topic, qid, begin_ms)
            while len(found) < max_count * 4:
                res = self.get(topic, qid, offset, 64)
                if not res.records:
                    break
                inside = [r for r in res.records if r.store_timestamp <= end_ms]
                found.extend(r for r in inside if r.store_timestamp >= begin_ms)
                if len(inside) < len(res.records):
                    break
                offset = res.next_offset
        found.sort(key=lambda r: (r.store_timestamp, r.physical_offset))
        return found[:max_count]

    # --- observability ---------------------------------------------------------------------
    @property
    def failure(self) -> str | None:
        """Why the store refuses every write until a restart (the writer stopped on an error),
        or None; a store closed cleanly has not failed."""
        error = self.log.error
        return None if error is None or error == CLOSED else error

    def stats(self) -> dict[str, float]:
        return {
            **{k: float(v) for k, v in self.writer.stats.items()},
            "writer_failed": 1.0 if self.failure else 0.0,
            "commitlog_min_offset": float(self.log.min_offset),
            "commitlog_max_offset": float(self.log.write_offset),
            "commitlog_synced_offset": float(self.log.synced_offset),
            "commitlog_segments": float(len(self.log.segments)),
            "consume_queues": float(len(self.dispatcher.queues)),
            "index_files": float(len(self.index.files)),
            "disk_used_ratio": self.disk.used_ratio(),
            "recovery_seconds": self.recovery_seconds,
        }
