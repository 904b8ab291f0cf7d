"""The check channel: one poller per check, live producers only, expiry, withdrawal, wake-ups."""

from __future__ import annotations

import asyncio

from tests.support.clock import FakeClock
from tidemq_server.broker.transactions.check_channel import CheckChannel, CheckTicket
from tidemq_server.broker.transactions.table import KeyedLocks


def ticket(txid: str, at: float, times: int = 1) -> CheckTicket:
    return CheckTicket(txid, "m-" + txid, "T", 0, times, 0, 100, at)


async def test_a_check_goes_to_one_live_poller_once() -> None:
    clock = FakeClock()
    ch = CheckChannel(hold_s=30, clock=clock)
    ch.offer("g", ticket("a", clock.now))
    ch.offer("g", ticket("b", clock.now))
    assert await ch.take("g", 10, 0, live=lambda: False) == []  # a silent producer gets none
    got = await ch.take("g", 1, 0, live=lambda: True)
    assert [t.txid for t in got] == ["a"]
    assert [t.txid for t in await ch.take("g", 10, 0, live=lambda: True)] == ["b"]
    assert await ch.take("g", 10, 0, live=lambda: True) == []  # handed out: never again
    assert await ch.take("other", 10, 0, live=lambda: True) == []


async def test_newer_check_replaces_older_and_ended_ones_are_withdrawn() -> None:
    clock = FakeClock()
    ch = CheckChannel(hold_s=30, clock=clock)
    ch.offer("g", ticket("a", clock.now, times=1))
    ch.offer("g", ticket("a", clock.now, times=2))
    ch.offer("g", ticket("b", clock.now))
    ch.withdraw("g", "b")
    assert [(t.txid, t.check_times) for t in await ch.take("g", 9, 0, lambda: True)] == \
        [("a", 2)]


async def test_unpolled_checks_expire_after_the_hold() -> None:
    clock = FakeClock()
    ch = CheckChannel(hold_s=5, clock=clock)
    ch.offer("g", ticket("old", clock.now))
    clock.now += 3
    ch.offer("g", ticket("new", clock.now))
    clock.now += 3
    assert [t.txid for t in await ch.take("g", 9, 0, lambda: True)] == ["new"]
    assert ch.expired == 1


async def test_a_waiting_poller_is_woken_by_an_offer_or_a_heartbeat() -> None:
    ch = CheckChannel(hold_s=30)
    alive = False
    waiter = asyncio.create_task(ch.take("g", 9, 5, lambda: alive))
    await asyncio.sleep(0.01)
    ch.offer("g", ticket("a", ch.clock()))
    await asyncio.sleep(0.01)
    assert not waiter.done()  # not live yet
    alive = True
    ch.wake("g")  # its heartbeat arrived
    got = await asyncio.wait_for(waiter, 1)
    assert [t.txid for t in got] == ["a"]


async def test_a_poller_that_hung_up_takes_nothing() -> None:
    ch = CheckChannel(hold_s=30)
    ch.offer("g", ticket("a", ch.clock()))

    async def gone() -> bool:
        return True

    assert await ch.take("g", 9, 0, lambda: True, gone) == []
    assert len(ch) == 1


async def test_keyed_locks_serialise_one_key_not_others() -> None:
    locks = KeyedLocks()
    order: list[str] = []
    held = await locks.acquire(["b", "a"])

    async def second(keys: list[str], name: str) -> None:
        taken = await locks.acquire(keys)
        order.append(name)
        locks.release(taken)

    blocked = asyncio.create_task(second(["a"], "same key"))
    free = asyncio.create_task(second(["c"], "other key"))
    await free
    await asyncio.sleep(0.01)
    assert order == ["other key"]
    locks.release(held)
    await blocked
    assert order == ["other key", "same key"] and len(locks) == 0
