"""Pending timers by hour and by day, from a real TimerStore directory: buckets wider than an
hour (each index entry's due time read), buckets that make up a day (counts only), loaded and
unloaded buckets, and timers cancelled or delivered (final marks) left out."""

from __future__ import annotations

from pathlib import Path

import msgpack

from tidemq_server.scheduler.buckets import Mark
from tidemq_server.scheduler.clock import Clock
from tidemq_server.scheduler.histogram import histogram
from tidemq_server.scheduler.lookup import locate
from tidemq_server.scheduler.timers import Timer, TimerConfig, TimerStore

HOUR = 3_600_000
DAY = 86_400_000
CONFIG = TimerConfig(bucket_ms=2 * HOUR, preload_ms=2_000, tick_ms=100, segment_bytes=1 << 20)


def _timer(i: int, due: int) -> Timer:
    row = ["T", 0, b"x", {"UNIQ_KEY": f"m{i}"}, 0, 0, due - 1000, "127.0.0.1:1", 0, 0]
    return Timer(due, i, f"m{i}", "T", msgpack.packb(row))


def _counts(answer: dict[str, object]) -> dict[int, int]:
    buckets = answer["buckets"]
    assert isinstance(buckets, list)
    return {b["start_ms"]: b["count"] for b in buckets}


async def test_by_hour_and_by_day(tmp_path: Path) -> None:
    clock = Clock()
    now = clock.now_ms()
    store = TimerStore(tmp_path, CONFIG, clock)
    store.recover()
    d0 = now - now % DAY + 2 * DAY
    dues = [d0 + 30 * 60_000, d0 + 90 * 60_000, d0 + 95 * 60_000, d0 + 5 * HOUR,
            d0 + DAY + HOUR, now + 1000]
    await store.ingest([_timer(i, due) for i, due in enumerate(dues)], len(dues))
    assert store.loaded  # the timer due in a second sits in a loaded bucket
    [cancelled] = await locate(store, "m2", dues[2])  # d0 + 95 min: cancelled
    await store.add_marks({cancelled.bucket: [(cancelled.pos, Mark.CANCELLED)]})
    near = now - now % HOUR
    hours = await histogram(store, "hour")
    assert hours["by"] == "hour" and hours["width_ms"] == HOUR
    assert _counts(hours) == {near if now + 1000 < near + HOUR else near + HOUR: 1,
                              d0: 1, d0 + HOUR: 1, d0 + 5 * HOUR: 1, d0 + DAY + HOUR: 1}
    days = await histogram(store, "day")
    today = now - now % DAY
    assert _counts(days) == {today if now + 1000 < today + DAY else today + DAY: 1,
                             d0: 3, d0 + DAY: 1}
    assert days["timers"] == hours["timers"] == 5
    store.close()
