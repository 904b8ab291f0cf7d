"""Roll and rebuild parts on a real TimerStore directory (the broker is a recording fake): rolled
rows, one pending copy per timer, the rebuild floor, rebuild cancels, a lost timer log set
aside, and rebuilt timers delivered strict."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import msgpack
from tidemq.protocol import REAL_TOPIC, TIDE_TIMER_ROLLS, TIMER_DELIVER_MS, DeliveryRow

from tidemq_server.scheduler.buckets import Mark
from tidemq_server.scheduler.clock import Clock
from tidemq_server.scheduler.lookup import locate
from tidemq_server.scheduler.metrics import SchedulerMetrics
from tidemq_server.scheduler.precancel import Precancels
from tidemq_server.scheduler.rebuild import prepare
from tidemq_server.scheduler.rolls import Roller, roll_count, rolled_row, strip_roll
from tidemq_server.scheduler.timerlog import Entry
from tidemq_server.scheduler.timers import Timer, TimerConfig, TimerStore

BUCKET = 10_000
CONFIG = TimerConfig(bucket_ms=BUCKET, preload_ms=2_000, tick_ms=100, segment_bytes=4096)
FAR = 3_600_000  # an hour away: its bucket is not in memory


class RecordingBroker:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def deliver(self, body: bytes) -> dict[str, Any]:
        self.bodies.append(msgpack.unpackb(body, raw=False))
        return {"stored": len(self.bodies[-1]["records"]), "duplicates": 0}


def _payload(mid: str, due: int, rolls: int = 0) -> bytes:
    props = {"UNIQ_KEY": mid}
    if rolls:
        props[TIDE_TIMER_ROLLS] = str(rolls)
    return msgpack.packb(["T", 1, mid.encode(), props, 0, 0, due - 5, "127.0.0.1:1", 0, 0])


def _timer(mid: str, intake: int, due: int, rolls: int = 0) -> Timer:
    return Timer(due, intake, mid, "T", _payload(mid, due, rolls), rolls)


def _open(root: Path, clock: Clock) -> tuple[TimerStore, Roller, RecordingBroker]:
    store = TimerStore(root, CONFIG, clock)
    store.recover()
    broker = RecordingBroker()
    roller = Roller(store, broker, SchedulerMetrics(), roll_after_ms=1000,  # type: ignore[arg-type]
                    batch=100)
    return store, roller, broker


def test_a_rolled_row_goes_back_to_intake_and_is_delivered_clean() -> None:
    entry = Entry(0, 0, 123_456, 0, 7, _payload("m", 123_456))
    row = DeliveryRow._make(msgpack.unpackb(rolled_row(entry), raw=False))
    assert row.topic == "TIDE_SYS_TIMER_INTAKE" and row.queue_id == 0
    assert row.properties[REAL_TOPIC] == "T" and row.properties[TIMER_DELIVER_MS] == "123456"
    assert row.body == b"m" and row.born_timestamp_ms == 123_451  # what dedup compares
    again = Entry(0, 0, 123_456, 0, 9, rolled_row(entry))
    assert roll_count(rolled_row(entry)) == 1 and roll_count(rolled_row(again)) == 2
    assert roll_count(_payload("m", 1)) == 0
    clean = DeliveryRow._make(msgpack.unpackb(strip_roll(_payload("m", 1, rolls=3)), raw=False))
    assert TIDE_TIMER_ROLLS not in clean.properties and clean.properties["UNIQ_KEY"] == "m"


async def test_one_pending_copy_per_timer_and_the_floor_follows(tmp_path: Path) -> None:
    clock = Clock()
    far = clock.now_ms() + FAR
    store, roller, broker = _open(tmp_path, clock)
    await store.ingest([_timer("a", 0, far), _timer("b", 1, far), _timer("c", 2, far + 1)], 3)
    assert await roller.run_once() == 0  # "a" at intake 0 is the oldest pending
    (found_b,) = await _locate(store, "b", far)
    await store.add_marks({found_b[0]: [(found_b[1], Mark.CANCELLED)]})
    store.finished(found_b[0], 1)
    store.ages[:] = [(time.time() - 10, store.log.write_offset)]  # everything is old enough
    await roller.run_once()
    rows = [DeliveryRow._make(r) for body in broker.bodies for r in body["records"]]
    assert sorted(r.properties["UNIQ_KEY"] for r in rows) == ["a", "c"]  # not the cancelled
    # the rolled copies come back through intake, with a stale copy of "b" too
    assert await store.ingest([_timer("a", 3, far, 1), _timer("b", 4, far, 1),
                               _timer("c", 5, far + 1, 1), _timer("c", 6, far + 1, 2)], 7) == 2
    assert store.pending == 2
    assert await roller.run_once() == 3  # the rolled "a" is the oldest pending now
    assert [sorted(m.values()) for m in map(store.buckets.read_marks, store.buckets.sizes)] \
        == [[Mark.CANCELLED, Mark.ROLLED, Mark.ROLLED]]
    # a copy of a timer whose older copy is in memory (about to be delivered) is dropped
    near = clock.now_ms() + 500
    await store.ingest([_timer("d", 7, near)], 8)
    assert await store.ingest([_timer("d", 8, near, 1)], 9) == 0
    assert store.pending == 3
    # ... and when that copy was cancelled before it was taken in, the older copy is cancelled
    await store.ingest([_timer("e", 9, near)], 10)
    assert store.wheel.count == 2
    store.precancels.add(None, "e", 10)
    assert await store.ingest([_timer("e", 10, near, 1)], 11) == 0
    assert store.pending == 3 and store.wheel.count == 1
    clock.advance(1000)
    due = store.wheel.pop_due(clock.now_ms())
    assert [len(d.positions) for d in due] == [1]  # "d" alone


async def _locate(store: TimerStore, mid: str, due: int) -> list[tuple[int, int]]:
    return [(f.bucket, f.pos) for f in await locate(store, mid, due)]


def test_rebuild_cancels_hold_for_every_copy_below_the_end(tmp_path: Path) -> None:
    path = tmp_path / "precancel.log"
    pre = Precancels(path)
    pre.add("T", "x", 4)
    pre.add_rebuilt([("T", "a"), (None, "b")], 10)
    again = Precancels(path)
    again.load()
    assert again.take("T", "a", 3) and again.take("T", "a", 7)  # the original and a rolled copy
    assert not again.take("T", "a", 10)  # past the end: a cancel of it goes through the scheduler
    assert again.take("T", "x", 4) and not again.take("T", "x", 4)
    again.prune(9)
    assert again.below == {("T", "a"): 10, (None, "b"): 10}
    again.prune(10)
    assert again.below == {}
    last = Precancels(path)
    last.load()
    assert last.below == {} and last.by_id == {}


async def test_a_cut_timer_log_is_set_aside_and_the_store_starts_fresh(tmp_path: Path) -> None:
    clock = Clock()
    root = tmp_path / "sched"
    store, _, _ = _open(root, clock)
    assert store.fresh
    await store.ingest([_timer(f"m{i}", i, clock.now_ms() + FAR) for i in range(30)], 30)
    await store.checkpoint()
    assert not _open(root, clock)[0].fresh
    last = root / "log" / f"{store.log.starts[-1]:020d}"
    os.truncate(last, last.stat().st_size // 2)  # a disk that lost the end of a file
    store.close()
    again, _, _ = _open(root, clock)
    assert again.fresh and again.pending == 0 and again.set_aside is not None
    assert again.set_aside.exists() and (root / "checkpoint.json").exists()


async def test_what_a_rebuild_files_is_delivered_strict(tmp_path: Path) -> None:
    clock = Clock()
    root = tmp_path / "sched"
    store, _, _ = _open(root, clock)
    now = clock.now_ms()
    store.ingested_next = 100
    store.begin_rebuild(102)
    assert store.rebuilding
    await store.ingest([_timer("r0", 100, now + 300)], 101)
    await store.ingest([_timer("r1", 101, now + FAR)], 102)  # the end: rebuild complete
    assert not store.rebuilding and store.strict_below == store.log.write_offset
    await store.ingest([_timer("n", 102, now + FAR)], 103)  # taken in after the rebuild
    await store.checkpoint()
    store.close()
    again, _, _ = _open(root, clock)
    clock.advance(FAR + 1000)
    for bucket in again.to_load(clock.now_ms()):
        await again.load(bucket)
    positions = {p for d in again.wheel.pop_due(clock.now_ms()) for p in d.positions}
    assert len(positions) == 3
    strict = positions & again.uncertain
    assert len(strict) == 2 and max(positions) not in strict  # "n" is not a rebuilt timer


async def test_how_old_an_entry_is_survives_a_restart(tmp_path: Path) -> None:
    clock = Clock()
    store, roller, broker = _open(tmp_path, clock)
    await store.ingest([_timer("a", 0, clock.now_ms() + FAR)], 1)
    await roller.run_once()
    marks = list(store.ages)
    assert marks and marks[-1][1] == store.log.write_offset
    await store.checkpoint()
    store.close()
    again, roller, broker = _open(tmp_path, clock)
    assert again.ages == marks
    again.ages[:] = [(t - 5, p) for t, p in again.ages]  # as if it had been down 5 s
    await roller.run_once()
    assert len(broker.bodies) == 1  # rolled at once: its age counts from before the restart


async def test_a_rebuild_cut_short_resumes_where_it_was(tmp_path: Path) -> None:
    clock = Clock()
    store, _, _ = _open(tmp_path, clock)
    store.ingested_next = 5
    store.begin_rebuild(10)
    await store.ingest([_timer("r5", 5, clock.now_ms() + FAR)], 6)
    store.close()  # killed: no checkpoint since begin_rebuild
    again, _, broker = _open(tmp_path, clock)
    assert not again.fresh and again.rebuilding and again.ingested_next == 6
    assert await prepare(again, broker, SchedulerMetrics(), 0) == 6  # type: ignore[arg-type]
    assert again.strict(0)  # what the rebuild filed is strict, and so is what follows


async def test_a_lost_bucket_index_sets_the_store_aside(tmp_path: Path) -> None:
    clock = Clock()
    root = tmp_path / "sched"
    store, _, _ = _open(root, clock)
    await store.ingest([_timer("a", 0, clock.now_ms() + FAR)], 1)
    await store.checkpoint()
    store.close()
    for index in (root / "buckets").glob("*.idx"):
        index.unlink()
    again, _, _ = _open(root, clock)
    assert again.fresh and again.set_aside is not None and again.pending == 0


def test_precancels_are_keyed_by_topic_and_read_old_files(tmp_path: Path) -> None:
    path = tmp_path / "precancel.log"
    pre = Precancels(path)
    pre.add("A", "x", 5)
    pre.add("B", "x", 6)  # the same id in another topic: a cancel of its own
    pre.add_rebuilt([("A", "y")], 10)
    again = Precancels(path)
    again.load()
    assert again.holds("A", "x", 5) and again.holds("B", "x", 6)
    assert not again.holds("B", "x", 5)
    assert not again.take("B", "y", 3) and again.take("A", "y", 3)  # never another topic's
    old = tmp_path / "old.log"  # written before cancels named a topic: any topic
    old.write_bytes(b"\0" * 7 + b"\x04\0\x01z")
    legacy = Precancels(old)
    legacy.load()
    assert legacy.by_id == {(None, "z"): 4} and legacy.take("Q", "z", 4)
