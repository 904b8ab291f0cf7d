"""TimerStore: the scheduler's timers on disk, with only the near window in memory.

- ``ingest`` appends timers to the timer log (one write + fdatasync per batch), then files each
  under its time bucket's index; a timer of a loaded bucket also goes into the wheel.
- Buckets are loaded (index minus final marks → wheel) ``preload_ms`` before they start; a far
  timer costs disk only — a 28-byte index entry and its log entry, no memory.
- ``checkpoint`` fsyncs the indexes and records how far they are durable; then it retires
  buckets that ended with every timer final (deleting their files) and timer-log segments
  whose every timer belongs to a retired bucket.
- ``recover`` rebuilds the indexes past the checkpoint from the timer log and counts what is
  pending. A store found empty is ``fresh``; a timer log that is missing or cut short below
  what the checkpoint recorded (corruption) is set aside and the store starts fresh: the
  scheduler then rebuilds it from the broker's intake topic (``begin_rebuild``; see
  services/scheduler/rebuild.py), and what a rebuild files is delivered ``strict``.
- a timer rolled back into the intake topic (services/scheduler/rolls.py) comes back as a
  copy with the same id and due time: ``ingest`` keeps exactly one pending copy of it. Between
  the ROLLED marks of its older copies and its filing, the copy is in ``filing``.

Ingest, bucket loading and cancel decisions hold ``lock``, so none sees the others half done.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import msgpack
from tidemq.protocol import UNIQ_KEY, DeliveryRow

from tidemq_server.scheduler.buckets import (
    ENTRY,
    ENTRY_SIZE,
    FINAL,
    MARK,
    BucketFiles,
    Mark,
    text_hash,
)
from tidemq_server.scheduler.checkpoint import Checkpoint
from tidemq_server.scheduler.clock import Clock
from tidemq_server.scheduler.marks import MarkWriter
from tidemq_server.scheduler.precancel import Precancels
from tidemq_server.scheduler.timerlog import Entry, TimerLog, encode
from tidemq_server.scheduler.wheel import Slot, Wheel

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TimerConfig:
    bucket_ms: int = 3_600_000  # width of a time bucket (ms)
    preload_ms: int = 600_000  # a bucket is loaded into memory this long before it starts (ms)
    tick_ms: int = 100  # wheel slot width (ms)
    segment_bytes: int = 256 * 1024 * 1024  # timer log segment size (bytes)


@dataclass(slots=True)
class Timer:
    """One timer to take in: the record to deliver (msgpack) and what indexes it."""

    due_ms: int
    intake: int  # offset in the broker's intake queue
    message_id: str
    topic: str  # the real topic it will be delivered to
    payload: bytes
    rolls: int = 0  # > 0: a copy rolled back into the intake topic (this many times)


class LostTimerLog(Exception):
    """The timer log is missing or shorter than the checkpoint says: rebuild the store."""


def payload_id(payload: bytes) -> tuple[str, str]:
    """(message id, real topic) of a timer-log payload (a msgpack ``DeliveryRow``)."""
    row = DeliveryRow._make(msgpack.unpackb(payload, raw=False))
    return row.properties.get(UNIQ_KEY, ""), row.topic


class TimerStore:
    def __init__(self, root: Path, config: TimerConfig, clock: Clock) -> None:
        if config.bucket_ms % config.tick_ms:
            raise ValueError("bucket_ms must be a multiple of tick_ms")
        self.root = root
        self.config = config
        self.clock = clock
        self._open_parts()
        self.wheel = Wheel(config.tick_ms, config.bucket_ms)
        self.checkpoint_path = root / "checkpoint.json"
        self.lock = asyncio.Lock()
        self.loaded: set[int] = set()
        self.live: dict[int, int] = {}  # loaded bucket → timers not final yet
        self.uncertain: set[int] = set()  # positions with a delivery intent and no outcome
        self.segments: dict[int, int] = {}  # log segment start → latest bucket in it
        self.indexed_end = 0
        self.ingested_next = 0
        self.pending = 0  # timers not final, over every bucket
        self.ingested = 0
        self.recovered = 0
        self.fresh = False  # nothing on disk at start: the scheduler rebuilds from the broker
        self.set_aside: Path | None = None  # where a lost or corrupt store was moved
        self.rebuild_end = 0  # see Checkpoint
        self.strict_below = 0
        self.ages: list[tuple[float, int]] = []  # see Checkpoint (kept by the roller)
        self.resolve_rolls: Callable[[list[Timer]], Awaitable[list[Timer]]] | None = None
        # (topic, id) → intake offset of a rolled copy kept by ``resolve_rolls`` (its older
        # copies marked ROLLED) and not filed yet: a cancel meanwhile pre-cancels that copy
        self.filing: dict[tuple[str, str], int] = {}

    def _open_parts(self) -> None:
        self.log = TimerLog(self.root / "log", self.config.segment_bytes)
        self.buckets = BucketFiles(self.root / "buckets", self.config.bucket_ms)
        self.precancels = Precancels(self.root / "precancel.log")
        self.marks = MarkWriter(self.buckets)

    @property
    def rebuilding(self) -> bool:
        return self.ingested_next < self.rebuild_end

    def strict(self, pos: int) -> bool:
        """A timer filed by a rebuild: the lost store may have delivered it already."""
        return pos < self.strict_below or self.rebuilding

    # --- recovery -------------------------------------------------------------------------
    def recover(self) -> None:
        """Open everything and rebuild derived state (blocking: run it in a thread). A lost or
        corrupt store is moved aside (``{data_dir}.lost-{ms}``) and the store starts fresh."""
        try:
            self._recover()
        except (LostTimerLog, ValueError, KeyError) as exc:
            self.close()
            aside = self.root.with_name(f"{self.root.name}.lost-{time.time_ns() // 1_000_000}")
            log.error("the timer store at %s cannot be used (%s): moved to %s; the timers "
                      "are rebuilt from the broker's intake topic", self.root, exc, aside)
            shutil.move(str(self.root), str(aside))
            self.set_aside = aside
            self._open_parts()
            self._recover()

    def _recover(self) -> None:
        began = time.monotonic()
        self.root.mkdir(parents=True, exist_ok=True)
        found = Checkpoint.load(self.checkpoint_path)
        cp = found or Checkpoint()
        self.log.open()
        self.fresh = not self.log.starts and cp.rebuild_end == 0
        if found is not None and found.indexed_end > 0 and (
                not self.log.starts or self.log.write_offset < found.indexed_end):
            raise LostTimerLog(f"the timer log ends at {self.log.write_offset}, the "
                               f"checkpoint says {found.indexed_end} was written")
        self.rebuild_end, self.strict_below = cp.rebuild_end, cp.strict_below
        self.ages = [(t, p) for t, p in cp.ages if p <= self.log.write_offset]
        self.buckets.open(cp.buckets)
        short = [b for b, n in cp.buckets.items() if self.buckets.sizes.get(b, 0) < n]
        if short:
            raise LostTimerLog(f"{len(short)} bucket index(es) are missing or shorter than the "
                               f"checkpoint says (bucket {short[0]})")
        self.precancels.load()
        self.segments = {s: b for s, b in cp.segments.items() if s in self.log.starts}
        self.ingested_next = cp.ingested_next
        start = max(cp.indexed_end, self.log.starts[0] if self.log.starts else 0)
        cancelled: dict[int, list[int]] = {}
        rebuilt: dict[int, bytearray] = {}
        for entry in self.log.scan(start):
            mid, topic = payload_id(entry.payload)
            rebuilt.setdefault(entry.bucket, bytearray()).extend(_index_entry(entry, mid, topic))
            self._note_segment(entry.pos, entry.bucket)
            self.ingested_next = max(self.ingested_next, entry.intake + 1)
            if self.precancels.take(topic, mid, entry.intake):
                cancelled.setdefault(entry.bucket, []).append(entry.pos)
            self.recovered += 1
        for bucket, data in rebuilt.items():
            self.buckets.append(bucket, bytes(data))
        for bucket, positions in cancelled.items():
            self.buckets.add_marks(bucket, b"".join(MARK.pack(p, Mark.CANCELLED)
                                                    for p in positions))
        if self.log.write_offset < cp.indexed_end:
            raise LostTimerLog(f"the timer log was cut at {self.log.write_offset}, below the "
                               f"checkpoint's {cp.indexed_end}: an entry is corrupt")
        self.indexed_end = self.log.write_offset
        for bucket in self.buckets.known():
            if not self.buckets.sizes.get(bucket):
                self.buckets.retire(bucket)  # marks of a bucket retired before the crash
        self.buckets.sync(*self.buckets.take_unsynced())
        self._save(self._capture([]))
        for bucket, size in self.buckets.sizes.items():
            final = sum(1 for m in self.buckets.read_marks(bucket).values() if m in FINAL)
            self.pending += size // ENTRY_SIZE - final
        log.info("timer store open at %s: %d pending timer(s) in %d bucket(s), timer log "
                 "[%d, %d), %d entries re-indexed in %.2fs", self.root, self.pending,
                 len(self.buckets.sizes), self.log.starts[0] if self.log.starts else 0,
                 self.log.write_offset, self.recovered, time.monotonic() - began)

    # --- intake -----------------------------------------------------------------------------
    async def ingest(self, timers: list[Timer], next_intake: int) -> int:
        """Take timers in durably; returns how many were new. ``next_intake``: the broker's
        intake offset after this batch (timers below ``ingested_next`` are repeats)."""
        fresh = [t for t in timers if t.intake >= self.ingested_next]
        if self.resolve_rolls is not None and any(t.rolls for t in fresh):
            fresh = await self.resolve_rolls(fresh)
        current = self.buckets.bucket_of(self.clock.now_ms())
        buckets = [max(self.buckets.bucket_of(t.due_ms), current) for t in fresh]
        encoded = [encode(t.due_ms, b, t.intake, t.payload)
                   for t, b in zip(fresh, buckets, strict=True)]
        positions: list[int] = []
        if encoded:
            positions, fds = self.log.append(encoded)
            await asyncio.to_thread(self.log.sync, fds)
        async with self.lock:
            if fresh:
                self._file(fresh, buckets, positions, [len(e) for e in encoded])
                self.indexed_end = self.log.write_offset
            was_rebuilding = self.rebuilding
            self.ingested_next = max(self.ingested_next, next_intake)
            if was_rebuilding and not self.rebuilding:
                self.strict_below = self.log.write_offset
                log.info("rebuild complete: intake taken in up to offset %d; %d pending "
                         "timer(s), those filed by the rebuild delivered strict",
                         self.ingested_next, self.pending)
        return len(fresh)

    def _file(self, timers: list[Timer], buckets: list[int], positions: list[int],
              sizes: list[int]) -> None:
        """Index freshly logged timers (the commit step of ``ingest``: no await inside)."""
        horizon = self.clock.now_ms() + self.config.preload_ms
        strict = self.rebuilding
        per_bucket: dict[int, bytearray] = {}
        cancelled: dict[int, list[int]] = {}
        for t, bucket, pos, size in zip(timers, buckets, positions, sizes, strict=True):
            per_bucket.setdefault(bucket, bytearray()).extend(ENTRY.pack(
                t.due_ms, pos, size, text_hash(t.message_id), text_hash(t.topic)))
            self._note_segment(pos, bucket)
            if t.rolls and self.filing.get((t.topic, t.message_id)) == t.intake:
                del self.filing[(t.topic, t.message_id)]
            if self.precancels.take(t.topic, t.message_id, t.intake):
                cancelled.setdefault(bucket, []).append(pos)
                continue
            self.pending += 1
            if bucket not in self.loaded and bucket < horizon and \
                    not self.buckets.sizes.get(bucket):
                self.loaded.add(bucket)  # a new near bucket: nothing on disk to load
                self.live[bucket] = 0
            if bucket in self.loaded:
                self.wheel.add(t.due_ms, pos, size, bucket)
                self.live[bucket] += 1
                if strict:
                    self.uncertain.add(pos)
        for bucket, data in per_bucket.items():
            self.buckets.append(bucket, bytes(data))
        for bucket, cancelled_positions in cancelled.items():  # rare: cancelled before intake
            self.buckets.add_marks(bucket, b"".join(MARK.pack(p, Mark.CANCELLED)
                                                    for p in cancelled_positions))
        self.ingested += len(timers)

    def _note_segment(self, pos: int, bucket: int) -> None:
        seg = self.log.starts[-1] if pos >= self.log.starts[-1] else max(
            s for s in self.log.starts if s <= pos)
        if self.segments.get(seg, -1) < bucket:
            self.segments[seg] = bucket

    # --- the near window --------------------------------------------------------------------
    def to_load(self, now: int) -> list[int]:
        horizon = now + self.config.preload_ms
        return [b for b in sorted(self.buckets.sizes) if b < horizon and b not in self.loaded]

    async def load(self, bucket: int) -> None:
        """Put a bucket's pending timers into the wheel (its index minus final marks)."""
        async with self.lock:
            if bucket in self.loaded:
                return
            size = self.buckets.sizes.get(bucket, 0)
            slots, uncertain, live = await asyncio.to_thread(self._read_bucket, bucket, size)
            self.wheel.merge(slots)
            self.uncertain |= uncertain
            self.live[bucket] = live
            self.loaded.add(bucket)
        log.info("loaded bucket %d into memory: %d pending timer(s)%s", bucket, live,
                 f", {len(uncertain)} to re-check with the broker" if uncertain else "")

    def _read_bucket(self, bucket: int, size: int) -> tuple[dict[int, Slot], set[int], int]:
        data = self.buckets.read_index(bucket, size)
        marks = self.buckets.read_marks(bucket)
        slots: dict[int, Slot] = {}
        uncertain: set[int] = set()
        seen: set[int] = set()
        live = 0
        tick = self.config.tick_ms
        for due, pos, entry_size, _, _ in ENTRY.iter_unpack(data):
            mark = marks.get(pos)
            if mark in FINAL or pos in seen:
                continue
            seen.add(pos)
            if mark is Mark.INTENT or self.strict(pos):
                uncertain.add(pos)
            n = max(due, bucket) // tick
            slot = slots.get(n)
            if slot is None:
                slot = slots[n] = Slot()
            slot.add(due, pos, entry_size)
            live += 1
        return slots, uncertain, live

    def finished(self, bucket: int, count: int) -> None:
        """``count`` timers of ``bucket`` became final (delivered, cancelled or skipped)."""
        self.pending -= count
        if bucket in self.live:
            self.live[bucket] -= count

    async def add_marks(self, marks: dict[int, list[tuple[int, Mark]]]) -> None:
        """Append marks per bucket, durably (group commit with concurrent callers)."""
        await self.marks.add(marks)

    def read(self, spots: list[tuple[int, int]]) -> list[Entry | Exception]:
        return list(self.log.read_many(spots))

    # --- checkpoint and retirement ----------------------------------------------------------
    def _capture(self, retiring: Iterable[int]) -> Checkpoint:
        gone = set(retiring)
        return Checkpoint(indexed_end=self.indexed_end, ingested_next=self.ingested_next,
                          buckets={b: s for b, s in self.buckets.sizes.items() if b not in gone},
                          segments=dict(self.segments), rebuild_end=self.rebuild_end,
                          strict_below=self.strict_below, ages=list(self.ages))

    def _save(self, cp: Checkpoint) -> None:
        cp.save(self.checkpoint_path)

    async def checkpoint(self) -> None:
        now = self.clock.now_ms()
        async with self.lock:
            retiring = [b for b in self.loaded if b + self.config.bucket_ms <= now
                        and self.live.get(b, 0) == 0]
            cp = self._capture(retiring)
            unsynced = self.buckets.take_unsynced()
        await asyncio.to_thread(self.buckets.sync, *unsynced)
        await asyncio.to_thread(self._save, cp)
        async with self.lock:
            for bucket in retiring:
                if self.live.get(bucket, 0) == 0:
                    self.loaded.discard(bucket)
                    self.live.pop(bucket, None)
                    self.buckets.retire(bucket)
            self.precancels.prune(cp.ingested_next)
            frontier = min([*self.buckets.sizes, *self.loaded], default=None)
            for seg in list(self.log.starts[:-1]):
                if self.log.segment_end(seg) <= cp.indexed_end and (
                        frontier is None or self.segments.get(seg, -1) < frontier):
                    self.log.delete_segment(seg)
                    self.segments.pop(seg, None)
        if retiring:
            log.info("retired %d finished bucket(s)", len(retiring))

    def begin_rebuild(self, end: int) -> None:
        """Mark this (fresh) store as rebuilding from the intake topic up to ``end``, durably
        before anything is taken in (blocking)."""
        self.rebuild_end = end
        self.strict_below = 0
        self._save(self._capture([]))

    def close(self) -> None:
        self.buckets.close()
        self.log.close()

    # --- observability ------------------------------------------------------------------------
    def disk_bytes(self) -> int:
        return self.log.disk_bytes() + self.buckets.disk_bytes()


def _index_entry(entry: Entry, mid: str, topic: str) -> bytes:
    return ENTRY.pack(entry.due_ms, entry.pos, entry.size, text_hash(mid), text_hash(topic))
