"""A strict re-delivery racing its first delivery (delays/redelivery.py) is stored once.

The scheduler retries a delivery ``strict`` when it is unsure an earlier request stored it; the
broker looks the record up first. These tests give the broker the two requests in the orders a
stall produces: together (the first still waiting for the writer when the retry's lookup runs)
and reversed (the retry stored before the first request's bytes are read). Then the guard's own
rules on their own: waiting, the window, a failed first request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tidemq.protocol import UNIQ_KEY
from tidemq.protocol.topics import Perm

from tests.support.procs import RedisServer
from tidemq_server.broker.delays.redelivery import RedeliveryGuard
from tidemq_server.broker.service import Broker
from tidemq_server.broker.settings import BrokerSettings

TOPIC = "Deliveries"
BORN_MS = 1_700_000_000_000


@pytest.fixture
async def broker(tmp_path: Path, redis_server: RedisServer) -> AsyncIterator[Broker]:
    settings = BrokerSettings(data_dir=tmp_path / "broker", redis_url=redis_server.url,
                              grpc_enabled=False, nameservers="", auto_create_topics=True)
    b = Broker(settings)
    await b.start()
    await b.topics.put(TOPIC, 1, Perm.READ_WRITE)
    try:
        yield b
    finally:
        await b.stop()


def row(mid: str) -> list[Any]:
    """One delivery row (``DELIVERY_FIELDS``) of message ``mid``."""
    return [TOPIC, 0, b"due", {UNIQ_KEY: mid}, 0, 0, BORN_MS, "127.0.0.1:1", 0, 0]


def stored_ids(b: Broker) -> list[str]:
    got = b.store.get(TOPIC, 0, 0, 100)
    return [r.properties[UNIQ_KEY] for r in got.records]


async def test_a_retry_meeting_its_first_request_in_flight_is_not_stored_again(
        broker: Broker) -> None:
    rows = [row("t-1"), row("t-2")]
    first, retry = await asyncio.gather(
        broker.delays.deliver({"records": rows}),
        broker.delays.deliver({"records": rows, "strict": [0, 1]}))
    assert first == {"stored": 2, "duplicates": 0}
    assert retry == {"stored": 0, "duplicates": 2}
    assert stored_ids(broker) == ["t-1", "t-2"]


async def test_a_first_request_read_after_its_strict_retry_is_not_stored_again(
        broker: Broker) -> None:
    retry = await broker.delays.deliver({"records": [row("t-3")], "strict": [0]})
    late = await broker.delays.deliver({"records": [row("t-3"), row("t-4")]})
    assert retry == {"stored": 1, "duplicates": 0}
    assert late == {"stored": 1, "duplicates": 1}  # t-4 was never delivered: stored
    assert stored_ids(broker) == ["t-3", "t-4"]


async def test_the_guard_waits_for_a_key_in_progress_then_asks_for_a_lookup() -> None:
    guard = RedeliveryGuard()
    a, b = (TOPIC, "a", 0, 1), (TOPIC, "b", 0, 1)
    assert await guard.to_look_up([a, b], set()) == set()  # nothing in progress: no lookup
    entered = asyncio.Event()
    release = asyncio.Event()

    async def first() -> None:
        with guard.storing([a], strict=False):
            entered.set()
            await release.wait()

    task = asyncio.create_task(first())
    await entered.wait()
    second = asyncio.create_task(guard.to_look_up([b, a], set()))
    await asyncio.sleep(0)
    assert not second.done()  # waits while ``a`` is being stored
    release.set()
    assert await second == {1} and guard.waited == 1
    await task
    assert await guard.to_look_up([a], set()) == set()  # a plain request is not remembered


async def test_a_waited_for_request_that_failed_still_leaves_the_lookup() -> None:
    guard = RedeliveryGuard()
    key = (TOPIC, "f", 0, 1)
    entered = asyncio.Event()

    async def failing() -> None:
        with guard.storing([key], strict=False):
            entered.set()
            await asyncio.sleep(0)
            raise OSError("disk")

    task = asyncio.create_task(failing())
    await entered.wait()
    assert await guard.to_look_up([key], set()) == {0}
    with pytest.raises(OSError):
        await task
    assert not guard._storing  # nothing left in progress


async def test_strict_keys_are_remembered_for_the_window_and_bounded() -> None:
    guard = RedeliveryGuard(window_s=0.05, max_keys=2)
    keys = [(TOPIC, f"k{i}", 0, 1) for i in range(3)]
    with guard.storing(keys, strict=True):
        pass
    # the oldest went past max_keys; the others are looked up, strict or not
    assert await guard.to_look_up(keys, set()) == {1, 2}
    await asyncio.sleep(0.06)
    assert await guard.to_look_up(keys, {0}) == {0}  # the window passed
