"""The scheduler's TimerStore on a real directory: intake, the near window, marks, recovery
after an unclean stop, cancels before intake, retirement of finished buckets and segments."""

from __future__ import annotations

from pathlib import Path

import msgpack

from tidemq_server.scheduler.buckets import Mark
from tidemq_server.scheduler.clock import Clock
from tidemq_server.scheduler.lookup import locate
from tidemq_server.scheduler.timers import Timer, TimerConfig, TimerStore

BUCKET = 10_000
CONFIG = TimerConfig(bucket_ms=BUCKET, preload_ms=2_000, tick_ms=100, segment_bytes=2048)


def _timer(i: int, due: int) -> Timer:
    row = ["T", 0, b"x" * 20, {"UNIQ_KEY": f"m{i}"}, 0, 0, due - 1000, "127.0.0.1:1", 0, 0]
    return Timer(due, i, f"m{i}", "T", msgpack.packb(row))


def _open(root: Path, clock: Clock) -> TimerStore:
    store = TimerStore(root, CONFIG, clock)
    store.recover()
    return store


async def _deliver_due(store: TimerStore, now: int) -> list[int]:
    """What the deliverer does, without a broker: take due timers, mark them delivered."""
    for bucket in store.to_load(now):
        await store.load(bucket)
    got = []
    for due in store.wheel.pop_due(now):
        entries = store.read(list(zip(due.positions, due.sizes, strict=True)))
        assert all(e.due_ms <= now for e in entries)  # type: ignore[union-attr]
        await store.add_marks({due.bucket: [(p, Mark.DELIVERED) for p in due.positions]})
        store.finished(due.bucket, len(due.positions))
        got += [e.intake for e in entries]  # type: ignore[union-attr]
    return sorted(got)


async def test_timers_survive_an_unclean_stop(tmp_path: Path) -> None:
    clock = Clock()
    now = clock.now_ms()
    store = _open(tmp_path, clock)
    timers = [_timer(i, now + 1000 * i) for i in range(40)]  # over 40 s: several buckets
    assert await store.ingest(timers[:20], 20) == 20
    assert await store.ingest(timers, 40) == 20  # the first 20 again: taken in once
    assert store.pending == 40 and store.ingested_next == 40
    assert len(store.log.starts) > 1
    assert await _deliver_due(store, now + 3_500) == [0, 1, 2, 3]
    # no checkpoint since the intake, no close: the indexes beyond it are rebuilt from the log
    again = _open(tmp_path, clock)
    assert again.pending == 36 and again.ingested_next == 40
    clock.advance(3_500)
    assert await _deliver_due(again, clock.now_ms()) == []  # delivered ones stay delivered
    clock.advance(50_000)
    assert await _deliver_due(again, clock.now_ms()) == list(range(4, 40))
    assert again.pending == 0
    await again.checkpoint()
    await again.checkpoint()  # the second retires buckets marked finished by the first
    assert not again.buckets.sizes and len(again.log.starts) == 1  # files of done buckets go


async def test_far_timers_stay_on_disk_and_can_be_found(tmp_path: Path) -> None:
    clock = Clock()
    now = clock.now_ms()
    store = _open(tmp_path, clock)
    await store.ingest([_timer(i, now + 86_400_000 + i) for i in range(100)], 100)
    assert store.pending == 100 and store.wheel.count == 0 and not store.loaded
    found = await locate(store, "m42", now + 86_400_000)
    assert [f.due_ms for f in found] == [now + 86_400_042]
    assert await locate(store, "m42", None) == found
    assert await locate(store, "nope", None) == []


async def test_a_cancel_before_intake_wins(tmp_path: Path) -> None:
    clock = Clock()
    now = clock.now_ms()
    store = _open(tmp_path, clock)
    store.precancels.add(None, "m1", 1)
    store2 = _open(tmp_path, clock)  # the early cancel is durable
    assert store2.precancels.by_id == {(None, "m1"): 1}
    await store2.ingest([_timer(0, now - 10), _timer(1, now - 10)], 2)
    assert store2.pending == 1
    assert await _deliver_due(store2, now) == [0]


def _in_topic(topic: str, intake: int, due: int) -> Timer:
    row = [topic, 0, b"x", {"UNIQ_KEY": "same"}, 0, 0, due - 1000, "127.0.0.1:1", 0, 0]
    return Timer(due, intake, "same", topic, msgpack.packb(row))


async def test_one_id_in_two_topics_is_two_timers(tmp_path: Path) -> None:
    """Ids are unique per topic only: a lookup by (topic, id) finds that topic's timer alone,
    and an early cancel of one topic's timer never cancels the other's."""
    clock = Clock()
    far = clock.now_ms() + 86_400_000
    store = _open(tmp_path, clock)
    store.precancels.add("B", "same", 1)  # cancelled before it was taken in
    await store.ingest([_in_topic("A", 0, far), _in_topic("B", 1, far)], 2)
    assert store.pending == 1
    assert [f.topic for f in await locate(store, "same", far, "A")] == ["A"]
    assert [f.topic for f in await locate(store, "same", None)] == ["A", "B"]
    assert await locate(store, "same", far, "C") == []
