"""PullHold: wakes waiters of notified (topic, queue) pairs within milliseconds, leaks none."""

from __future__ import annotations

import asyncio
import time

from services.broker.messaging.longpoll import PullHold


async def test_notify_wakes_waiter_within_milliseconds() -> None:
    hold = PullHold()
    task = asyncio.create_task(hold.wait([("T", 0), ("T", 1)], 5.0))
    await asyncio.sleep(0.01)
    assert hold.waiter_count() == 1
    started = time.perf_counter()
    hold.notify({("T", 1)})
    assert await task is True
    assert time.perf_counter() - started < 0.05
    assert hold.waiter_count() == 0 and hold.keys_held == 0


async def test_timeout_returns_false_and_leaves_nothing_behind() -> None:
    hold = PullHold()
    started = time.perf_counter()
    assert await hold.wait([("T", 0), ("U", 3)], 0.05) is False
    assert 0.04 <= time.perf_counter() - started < 0.5
    assert hold.waiter_count() == 0 and hold.keys_held == 0


async def test_cancelled_waiter_is_removed() -> None:
    hold = PullHold()
    task = asyncio.create_task(hold.wait([("T", 0)], 5.0))
    await asyncio.sleep(0.01)
    assert hold.waiter_count() == 1
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert hold.waiter_count() == 0 and hold.keys_held == 0
    hold.notify({("T", 0)})  # nothing to wake, nothing breaks


async def test_other_keys_do_not_wake() -> None:
    hold = PullHold()
    task = asyncio.create_task(hold.wait([("T", 0)], 0.1))
    await asyncio.sleep(0.01)
    hold.notify({("T", 1), ("U", 0)})
    assert await task is False


async def test_one_notify_wakes_every_waiter_of_the_key() -> None:
    hold = PullHold()
    tasks = [asyncio.create_task(hold.wait([("T", 0)], 5.0)) for _ in range(100)]
    await asyncio.sleep(0.01)
    assert hold.waiter_count() == 100
    hold.notify({("T", 0)})
    assert await asyncio.wait_for(asyncio.gather(*tasks), 1.0) == [True] * 100
    assert hold.waiter_count() == 0 and hold.keys_held == 0
    assert hold.notified == 100


async def test_zero_timeout_does_not_wait() -> None:
    hold = PullHold()
    assert await hold.wait([("T", 0)], 0) is False
    assert hold.waiter_count() == 0


async def test_watch_remembers_a_notify_before_wait() -> None:
    hold = PullHold()
    with hold.watch([("T", 0)]) as watch:
        hold.notify({("T", 0)})  # arrives while the caller is still checking for messages
        assert watch.fired
        assert await watch.wait(5.0) is True
    assert hold.waiter_count() == 0


async def test_wake_all_releases_waiters_and_refuses_new_ones() -> None:
    hold = PullHold()
    tasks = [asyncio.create_task(hold.wait([("T", q)], 30.0)) for q in range(5)]
    await asyncio.sleep(0.01)
    hold.wake_all()
    assert await asyncio.wait_for(asyncio.gather(*tasks), 1.0) == [False] * 5
    started = time.perf_counter()
    assert await hold.wait([("T", 0)], 30.0) is False
    assert time.perf_counter() - started < 0.05
    assert hold.waiter_count() == 0


async def test_notify_without_waiters_is_cheap() -> None:
    hold = PullHold()
    keys = {("T", q) for q in range(8)}
    started = time.perf_counter()
    for _ in range(100_000):
        hold.notify(keys)
    assert time.perf_counter() - started < 0.5
