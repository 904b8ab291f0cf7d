"""PullHold: wakes waiters of notified (topic, queue) pairs on the next loop turn, leaks none.

How fast a real held pull wakes is bench/produce_consume.py's "wake" segment."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

from tidemq_server.broker.messaging.longpoll import Key, PullHold


async def loop_turns(n: int = 3) -> None:
    """Let the event loop run ``n`` rounds of ready callbacks (no timer is due meanwhile)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def test_notify_wakes_the_waiter_on_the_next_loop_turn() -> None:
    hold = PullHold()
    task = asyncio.create_task(hold.wait([("T", 0), ("T", 1)], 30.0))
    await asyncio.sleep(0.01)
    assert hold.waiter_count() == 1
    hold.notify({("T", 1)})
    await loop_turns()
    assert task.done() and task.result() is True  # woken by the notify, not its 30 s timer
    assert hold.notified == 1
    assert hold.waiter_count() == 0 and hold.keys_held == 0


async def test_timeout_returns_false_and_leaves_nothing_behind() -> None:
    hold = PullHold()
    started = time.perf_counter()
    assert await hold.wait([("T", 0), ("U", 3)], 0.05) is False
    # held for its timeout; ended by it (a unit mix-up, ms taken for s, would hold it 50 s)
    assert 0.04 <= time.perf_counter() - started < 5.0
    assert hold.notified == 0
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
    await loop_turns()
    assert [t.done() and t.result() for t in tasks] == [True] * 100
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
    await loop_turns()
    assert [t.done() and t.result() for t in tasks] == [False] * 5  # released, not timed out
    late = asyncio.create_task(hold.wait([("T", 0)], 30.0))
    await loop_turns(1)
    assert late.done() and late.result() is False  # answered at once, never held
    assert hold.waiter_count() == 0


class CountingKeys:
    """Keys that count how often a notify looks at them."""

    def __init__(self, keys: list[Key]) -> None:
        self.keys = keys
        self.looked = 0

    def __iter__(self) -> Iterator[Key]:
        self.looked += 1
        return iter(self.keys)


async def test_notify_without_waiters_does_no_work() -> None:
    """The store notifies after every dispatched batch: with nobody waiting, a notify returns
    before it looks at its keys, and leaves nothing behind."""
    hold = PullHold()
    keys = CountingKeys([("T", q) for q in range(8)])
    for _ in range(3):
        hold.notify(keys)
    assert keys.looked == 0 and hold.notified == 0 and hold.keys_held == 0
    task = asyncio.create_task(hold.wait([("U", 0)], 30.0))  # someone waits, on another key
    await asyncio.sleep(0.01)
    hold.notify(keys)
    assert keys.looked == 1 and hold.notified == 0 and not task.done()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
