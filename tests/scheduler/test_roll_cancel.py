"""A cancel of a pending timer while it is rolled is always decided, never "not found": on a real
TimerStore directory, the canceller is driven into each window of a roll (services/scheduler/
rolls.py) — the older copy marked ROLLED while the rolled copy is not filed yet, the older copy
found just before the roll and decided just after, the rolled copy filed in a later bucket —
with the broker's hint naming the older copy (its index did not show the rolled one yet)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import msgpack
import pytest
from tidemq.protocol import TIDE_TIMER_ROLLS

from tidemq_server.scheduler import cancel as cancel_module
from tidemq_server.scheduler.buckets import Mark
from tidemq_server.scheduler.cancel import Canceller, Outcome
from tidemq_server.scheduler.clock import Clock
from tidemq_server.scheduler.metrics import SchedulerMetrics
from tidemq_server.scheduler.rolls import Roller
from tidemq_server.scheduler.timers import Timer, TimerConfig, TimerStore

BUCKET = 10_000
CONFIG = TimerConfig(bucket_ms=BUCKET, preload_ms=2_000, tick_ms=100, segment_bytes=4096)
FAR = 3_600_000  # an hour away: its bucket is not in memory (only such timers roll)
HELD_S = 10.0  # the longest a test holds an ingest in its log fsync (a safety net: never hit)


class NoBroker:
    async def deliver(self, body: bytes) -> dict[str, Any]:
        raise AssertionError("nothing is rolled by the roller here: copies are ingested")


def _timer(mid: str, intake: int, due: int, rolls: int = 0) -> Timer:
    props = {"UNIQ_KEY": mid}
    if rolls:
        props[TIDE_TIMER_ROLLS] = str(rolls)
    payload = msgpack.packb(["T", 1, mid.encode(), props, 0, 0, due - 5, "127.0.0.1:1", 0, 0])
    return Timer(due, intake, mid, "T", payload, rolls)


def _open(root: Path, clock: Clock) -> tuple[TimerStore, Canceller]:
    store = TimerStore(root, CONFIG, clock)
    store.recover()
    metrics = SchedulerMetrics()
    Roller(store, NoBroker(), metrics, roll_after_ms=1000, batch=100)  # type: ignore[arg-type]
    # every timer here is on disk or in the wheel: no delivery or level is ever asked
    return store, Canceller(store, None, None, metrics)  # type: ignore[arg-type]


def _marks(store: TimerStore) -> dict[int, Mark]:
    return {p: m for b in store.buckets.sizes for p, m in store.buckets.read_marks(b).items()}


async def _nothing_fires(store: TimerStore, clock: Clock) -> None:
    """Past every due time, with every bucket loaded: the wheel holds nothing to deliver."""
    clock.advance(FAR + 2 * BUCKET)
    for bucket in store.to_load(clock.now_ms()):
        await store.load(bucket)
    assert store.wheel.pop_due(clock.now_ms()) == []


async def test_a_cancel_after_the_older_copy_is_marked_and_before_the_rolled_one_is_filed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    far = clock.now_ms() + FAR
    store, canceller = _open(tmp_path, clock)
    await store.ingest([_timer("a", 0, far)], 1)
    entered, release = threading.Event(), threading.Event()
    sync = store.log.sync

    def held_sync(fds: list[int]) -> None:  # the rolled copy's log fsync, held
        entered.set()
        release.wait(HELD_S)
        sync(fds)

    monkeypatch.setattr(store.log, "sync", held_sync)
    ingest = asyncio.create_task(store.ingest([_timer("a", 1, far, rolls=1)], 2))
    assert await asyncio.to_thread(entered.wait, HELD_S)
    assert set(_marks(store).values()) == {Mark.ROLLED}  # the older copy is superseded
    try:  # the broker's hint: the original copy, already taken in
        decision = await asyncio.wait_for(
            canceller.cancel("a", topic="T", due_ms=far, intake_offset=0), HELD_S / 2)
    finally:
        release.set()
    assert await ingest == 1
    assert decision.outcome is Outcome.CANCELLED, decision
    assert store.pending == 0
    assert sorted(_marks(store).values()) == [Mark.CANCELLED, Mark.ROLLED]
    assert (await canceller.cancel("a", topic="T", due_ms=far, intake_offset=1)).outcome \
        is Outcome.ALREADY_CANCELLED  # the rolled copy is the one cancelled
    await _nothing_fires(store, clock)


async def test_a_cancel_that_found_the_older_copy_just_before_the_roll(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    far = clock.now_ms() + FAR
    store, canceller = _open(tmp_path, clock)
    await store.ingest([_timer("a", 0, far)], 1)
    real_locate = cancel_module.locate
    rolled: list[int] = []

    async def locate_then_roll(*args: Any, **kwargs: Any) -> Any:
        found = await real_locate(*args, **kwargs)
        if not rolled:  # between the lookup and the decision, the rolled copy is filed
            rolled.append(await store.ingest([_timer("a", 1, far, rolls=1)], 2))
        return found

    monkeypatch.setattr(cancel_module, "locate", locate_then_roll)
    decision = await canceller.cancel("a", topic="T", due_ms=far, intake_offset=0)
    assert rolled == [1]
    assert decision.outcome is Outcome.CANCELLED, decision
    assert store.pending == 0
    assert sorted(_marks(store).values()) == [Mark.CANCELLED, Mark.ROLLED]
    await _nothing_fires(store, clock)


async def test_a_rolled_copy_filed_in_a_later_bucket_is_found(tmp_path: Path) -> None:
    clock = Clock()
    far = clock.now_ms() + FAR
    store, canceller = _open(tmp_path, clock)
    await store.ingest([_timer("a", 0, far)], 1)
    clock.advance(FAR + BUCKET)  # the rolled copy comes in when it is due already
    await store.ingest([_timer("a", 1, far, rolls=1)], 2)
    assert len(store.buckets.sizes) == 2 and store.pending == 1
    decision = await canceller.cancel("a", topic="T", due_ms=far, intake_offset=0)
    assert decision.outcome is Outcome.CANCELLED, decision
    assert store.pending == 0 and store.wheel.count == 0


async def test_a_cancel_of_an_unknown_id_says_where_it_looked(tmp_path: Path) -> None:
    clock = Clock()
    store, canceller = _open(tmp_path, clock)
    await store.ingest([_timer("a", 0, clock.now_ms() + FAR)], 1)
    decision = await canceller.cancel("zz", topic="T", due_ms=clock.now_ms() + FAR,
                                      intake_offset=0)
    assert decision.outcome is Outcome.NOT_FOUND
    assert "no timer" in decision.detail and "1 bucket" in decision.detail


async def test_rolled_copies_with_the_newest_not_taken_in_answer_busy(tmp_path: Path) -> None:
    clock = Clock()
    far = clock.now_ms() + FAR
    store, canceller = _open(tmp_path, clock)
    await store.ingest([_timer("a", 0, far)], 1)
    assert store.resolve_rolls is not None
    await store.resolve_rolls([_timer("a", 1, far, rolls=1)])  # marked, then the process died
    store.filing.clear()  # a new process: the copy comes back through intake later
    decision = await canceller.cancel("a", topic="T", due_ms=far, intake_offset=0)
    assert decision.outcome is Outcome.BUSY and "not taken in yet" in decision.detail
    await store.ingest([_timer("a", 1, far, rolls=1)], 2)  # asked again once it is
    assert (await canceller.cancel("a", topic="T", due_ms=far, intake_offset=0)).outcome \
        is Outcome.CANCELLED
    assert store.pending == 0
