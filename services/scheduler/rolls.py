"""Timer roll and the rebuild floor: the timer log stays a cache of the broker's commit log.

Every pending timer can be rebuilt from the broker's intake topic as long as the broker keeps
the intake record it came from. The **rebuild floor** is the oldest intake offset a pending
timer depends on: it is saved in Redis (``scheduler_rebuild_key``) and the broker's retention
floor is held there. A timer due in days would hold the broker's retention for days, so a long
timer is **rolled** (RocketMQ 5's timer roll): once its intake record is older than
``roll_after_ms`` (wall time), it is put back into the intake topic with the same message id,
real topic, body and due time and a roll count (``TIDE_TIMER_ROLLS``). The rolled copy comes
back through intake; ``resolve`` keeps exactly one pending copy per timer:

- an older copy already final (delivered, cancelled, skipped): the rolled copy is dropped;
- an older copy pending in a bucket in memory (about to be delivered): the rolled copy is
  dropped — and if the copy was cancelled before it was taken in (a pre-cancel: the broker
  pointed the cancel at the newest copy), the older copy is taken out of the wheel and
  cancelled instead;
- otherwise the older pending copies get a ROLLED mark (fsynced) and the rolled copy is filed;
  from the marks until it is filed (its log write and fsync come between) it is in
  ``TimerStore.filing``. A cancel meeting a ROLLED copy follows it to the newer copy
  (services/scheduler/cancel.py): pre-cancelled while being filed, else looked up.

A roll puts copies while holding the store's lock, so a cancel is decided either before (the
timer is not pending: not rolled) or after the copy is stored (the broker's cancel record
follows every copy of the timer). Only timers of buckets not in memory roll: delivery never
holds them. The floor then moves past the old copies, and broker retention stays bounded by
``roll_after_ms`` plus the roll interval.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import msgpack
from tidemq.protocol import (
    REAL_QID,
    REAL_TOPIC,
    TIDE_TIMER_ROLLS,
    TIMER_DELIVER_MS,
    DeliveryRow,
    SystemTopic,
)

from tidemq_server.common.broker_client import BrokerClient, deliver_body
from tidemq_server.scheduler.buckets import ENTRY, FINAL, Mark, text_hash
from tidemq_server.scheduler.lookup import HASH_AT, _hits
from tidemq_server.scheduler.metrics import SchedulerMetrics
from tidemq_server.scheduler.timerlog import Entry
from tidemq_server.scheduler.timers import Timer, TimerStore, payload_id

log = logging.getLogger(__name__)

ROLL_MARKER = TIDE_TIMER_ROLLS.encode()
AGE_MARKS = 16  # age marks kept per roll_after_ms (how finely the age of a position is known)
SCAN_YIELD = 64  # buckets looked at between two yields to the event loop


def roll_count(payload: bytes) -> int:
    """The roll count of a delivery row (0: not a rolled copy). Cheap for the common case."""
    if ROLL_MARKER not in payload:
        return 0
    row = DeliveryRow._make(msgpack.unpackb(payload, raw=False))
    try:
        return int(row.properties.get(TIDE_TIMER_ROLLS, 0))
    except (TypeError, ValueError):
        return 0


def strip_roll(payload: bytes) -> bytes:
    """The delivery row without the roll count (what the real topic gets)."""
    if ROLL_MARKER not in payload:
        return payload
    row = DeliveryRow._make(msgpack.unpackb(payload, raw=False))
    if TIDE_TIMER_ROLLS not in row.properties:
        return payload
    props = {k: v for k, v in row.properties.items() if k != TIDE_TIMER_ROLLS}
    return msgpack.packb(tuple(row._replace(properties=props)), use_bin_type=True)


def rolled_row(entry: Entry) -> bytes:
    """A timer-log entry as a delivery row into the intake topic: its rolled copy."""
    row = DeliveryRow._make(msgpack.unpackb(entry.payload, raw=False))
    props = dict(row.properties)
    rolls = int(props.get(TIDE_TIMER_ROLLS, 0) or 0) + 1
    props.update({REAL_TOPIC: row.topic, REAL_QID: str(row.queue_id),
                  TIMER_DELIVER_MS: str(entry.due_ms), TIDE_TIMER_ROLLS: str(rolls)})
    out = row._replace(topic=SystemTopic.TIMER_INTAKE.value, queue_id=0, properties=props)
    return msgpack.packb(tuple(out), use_bin_type=True)


@dataclass(slots=True)
class Scan:
    first_pending: tuple[int, int] | None  # (pos, size): the lowest pending in the timer log
    candidates: list[tuple[int, int, int]]  # (bucket, pos, size) old enough to roll


class Roller:
    def __init__(self, store: TimerStore, broker: BrokerClient, metrics: SchedulerMetrics,
                 roll_after_ms: int, batch: int) -> None:
        self.store = store
        self.broker = broker
        self.metrics = metrics
        self.roll_after_ms = roll_after_ms
        self.batch = batch
        self.recent: dict[int, float] = {}  # position rolled → when (not rolled again soon)
        self.floor = 0  # the last rebuild floor computed
        store.resolve_rolls = self.resolve

    # --- the rebuild floor and what to roll ---------------------------------------------------
    def _age_position(self, now_s: float) -> int:
        """Timer-log entries below the returned position were taken in ``roll_after_ms`` ago
        or earlier (0 until this process has run that long)."""
        ages = self.store.ages  # (wall s, timer-log end then), oldest first; checkpointed
        step = self.roll_after_ms / 1000 / AGE_MARKS
        if not ages or now_s - ages[-1][0] >= step:
            ages.append((now_s, self.store.log.write_offset))
        cutoff = now_s - self.roll_after_ms / 1000
        old = [pos for at, pos in ages if at <= cutoff]
        while len(ages) > 1 and ages[1][0] <= cutoff:
            ages.pop(0)
        return old[-1] if old else 0

    async def _scan(self, age_pos: int) -> Scan:
        """A bucket's index is in timer-log order: its first pending entry is its oldest, and
        the walk stops there unless entries old enough to roll may follow — a few small reads
        per bucket, on the event loop (yielding every ``SCAN_YIELD`` buckets)."""
        store = self.store
        first: tuple[int, int] | None = None
        candidates: list[tuple[int, int, int]] = []
        loaded = set(store.loaded)
        now = time.monotonic()
        for n, (bucket, size) in enumerate(sorted(store.buckets.sizes.items())):
            if n % SCAN_YIELD == SCAN_YIELD - 1:
                await asyncio.sleep(0)
            try:
                marks = store.buckets.read_marks(bucket)
                for _, pos, entry_size, _, _ in store.buckets.iter_index(bucket, size):
                    if marks.get(pos) in FINAL:
                        continue
                    if first is None or pos < first[0]:
                        first = (pos, entry_size)
                    if pos >= age_pos or bucket in loaded:
                        break
                    if now - self.recent.get(pos, -1e18) > self.roll_after_ms / 1000:
                        candidates.append((bucket, pos, entry_size))
            except FileNotFoundError:
                continue  # retired meanwhile: nothing pending in it
        return Scan(first, candidates)

    async def run_once(self) -> int:
        """Roll what is old enough, then compute the rebuild floor (returned)."""
        store = self.store
        age_pos = self._age_position(time.time())
        covered = store.ingested_next  # before the scan: whatever is filed later is above it
        scan = await self._scan(age_pos)
        floor = covered
        if scan.first_pending is not None:
            (entry,) = store.read([scan.first_pending])
            if isinstance(entry, Entry) and entry.intake >= 0:
                floor = min(floor, entry.intake)
            else:  # unreadable: never move the floor past it
                floor = min(floor, self.floor)
        self.floor = floor  # copies rolled now move it at the next run, once taken in
        log.debug("roll pass: age position %d, %d pending, %d to roll, floor %d", age_pos,
                  store.pending, len(scan.candidates), floor)
        horizon = time.monotonic() - self.roll_after_ms / 1000
        self.recent = {p: t for p, t in self.recent.items() if t > horizon}
        if scan.candidates:
            await self._roll(sorted(scan.candidates, key=lambda c: c[1])[:self.batch])
        return floor

    async def _roll(self, candidates: list[tuple[int, int, int]]) -> None:
        store = self.store
        async with store.lock:
            marks = {b: await asyncio.to_thread(store.buckets.read_marks, b)
                     for b in {c[0] for c in candidates}}
            still = [(b, p, s) for b, p, s in candidates
                     if b not in store.loaded and b in store.buckets.sizes
                     and marks[b].get(p) not in FINAL]
            if not still:
                return
            entries = store.read([(p, s) for _, p, s in still])
            rows = [rolled_row(e) for e in entries if isinstance(e, Entry)]
            for i in range(0, len(rows), 1024):
                await self.broker.deliver(deliver_body(rows[i:i + 1024], []))
            now = time.monotonic()
            for _, pos, _ in still:
                self.recent[pos] = now
        self.metrics.rolled.inc(len(rows))
        log.info("rolled %d long timer(s) back into the intake topic", len(rows))

    # --- one pending copy per timer (called by TimerStore.ingest) ---------------------------
    async def resolve(self, timers: list[Timer]) -> list[Timer]:
        store = self.store
        last: dict[tuple[str, str], int] = {}  # (topic, id) → its last rolled copy here
        for i, t in enumerate(timers):
            if t.rolls:
                last[(t.topic, t.message_id)] = i
        keep = [t for i, t in enumerate(timers)
                if last.get((t.topic, t.message_id), i) == i]
        rolled = [t for t in keep if t.rolls]
        async with store.lock:
            older = await asyncio.to_thread(self._older_copies, rolled)
            drop: set[tuple[str, str]] = set()  # (topic, id) of rolled copies dropped
            superseded: dict[int, list[tuple[int, Mark]]] = {}
            cancelled: dict[int, list[tuple[int, Mark]]] = {}
            for t in rolled:
                key = (t.topic, t.message_id)
                copies = older.get(key, [])
                if any(m in FINAL and m is not Mark.ROLLED for _, _, m in copies):
                    drop.add(key)
                    continue
                in_memory = [(b, p) for b, p, m in copies if b in store.loaded and m not in FINAL]
                if in_memory:
                    drop.add(key)
                    if store.precancels.holds(t.topic, t.message_id, t.intake):
                        for bucket, pos in in_memory:
                            if store.wheel.remove(t.due_ms, pos, bucket):
                                cancelled.setdefault(bucket, []).append((pos, Mark.CANCELLED))
                            else:
                                log.error("timer %s was cancelled through its rolled copy "
                                          "while being delivered: it is delivered",
                                          t.message_id)
                    continue
                for bucket, pos, mark in copies:
                    if mark not in FINAL:
                        superseded.setdefault(bucket, []).append((pos, Mark.ROLLED))
                store.filing[key] = t.intake  # until filed: a cancel pre-cancels it
            for marks in (superseded, cancelled):
                if marks:
                    await store.add_marks(marks)
                    for bucket, items in marks.items():
                        store.finished(bucket, len(items))
        if drop:
            log.info("%d rolled timer copy(ies) dropped: an older copy decides", len(drop))
        return [t for t in keep if not (t.rolls and (t.topic, t.message_id) in drop)]

    def _older_copies(self, timers: list[Timer]
                      ) -> dict[tuple[str, str], list[tuple[int, int, Mark | None]]]:
        """(topic, message id) → (bucket, pos, mark) of each copy filed: in the bucket of its
        due time or, filed when already due, a later one up to the current bucket (an id
        waiting in another topic is another timer)."""
        store = self.store
        current = store.buckets.bucket_of(store.clock.now_ms())
        indexes: dict[int, bytes] = {}
        marks: dict[int, dict[int, Mark]] = {}
        out: dict[tuple[str, str], list[tuple[int, int, Mark | None]]] = {}
        for t in timers:
            first = store.buckets.bucket_of(t.due_ms)
            buckets = [b for b in sorted(store.buckets.sizes) if first <= b <= max(first, current)]
            h = text_hash(t.message_id)
            for bucket in buckets:
                if bucket not in indexes:
                    try:
                        indexes[bucket] = store.buckets.read_index(bucket)
                        marks[bucket] = store.buckets.read_marks(bucket)
                    except FileNotFoundError:
                        indexes[bucket], marks[bucket] = b"", {}
                data = indexes[bucket]
                for at in _hits(data, h, HASH_AT):
                    _, pos, size, _, _ = ENTRY.unpack_from(data, at)
                    (entry,) = store.read([(pos, size)])
                    key = (t.topic, t.message_id)
                    if isinstance(entry, Entry) and payload_id(entry.payload)[::-1] == key:
                        out.setdefault(key, []).append(
                            (bucket, pos, marks[bucket].get(pos)))
        return out

