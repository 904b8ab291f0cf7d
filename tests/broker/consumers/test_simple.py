"""Simple consumer against a real redis-server and an in-memory fake store."""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from tidemq.protocol import ErrorCode, ProtocolError

from tests.support.clock import FakeClock
from tests.support.procs import RedisServer
from tests.support.wait import wait_until_async
from tidemq_server.broker.consumers.offsets import OffsetStore
from tidemq_server.broker.consumers.receipts import decode_receipt, encode_receipt
from tidemq_server.broker.consumers.simple import MAX_WAIT_MS, Received, SimpleConsumerService
from tidemq_server.broker.messaging.longpoll import PullHold
from tidemq_server.broker.store.types import GetResult, GetStatus, StoredRecord, tag_code

pytestmark = pytest.mark.integration


class FakeStore:
    """The three store methods the broker's consumers use, over lists in memory."""

    def __init__(self, honor_tag_codes: bool = True) -> None:
        self.queues: dict[tuple[str, int], list[StoredRecord]] = {}
        self.min: dict[tuple[str, int], int] = {}
        self.listeners: list[Callable[[set[tuple[str, int]]], None]] = []
        self.honor_tag_codes = honor_tag_codes

    def add_listener(self, callback: Callable[[set[tuple[str, int]]], None]) -> None:
        self.listeners.append(callback)

    def append(self, topic: str, queue_id: int, body: str, tag: str | None = None) -> int:
        queue = self.queues.setdefault((topic, queue_id), [])
        props = {"UNIQ_KEY": uuid.uuid4().hex}
        if tag:
            props["TAGS"] = tag
        offset = len(queue)
        queue.append(StoredRecord(
            physical_offset=offset, size=len(body), topic=topic, queue_id=queue_id,
            queue_offset=offset, body=body.encode(), properties=props, flag=0, sys_flag=0,
            born_timestamp=0, born_host="h:1", store_timestamp=0, store_host="h:2",
            reconsume_times=0, prepared_tx_offset=0))
        for listener in self.listeners:
            listener({(topic, queue_id)})
        return offset

    def queue_offsets(self, topic: str, queue_id: int) -> tuple[int, int]:
        queue = self.queues.get((topic, queue_id), [])
        return self.min.get((topic, queue_id), 0), len(queue)

    def get(self, topic: str, queue_id: int, offset: int, max_count: int,
            tag_codes: frozenset[int] | None = None) -> GetResult:
        lo, hi = self.queue_offsets(topic, queue_id)
        if offset > hi:
            return GetResult(GetStatus.OFFSET_OVERFLOW, [], offset, lo, hi)
        corrected, offset = offset < lo, max(offset, lo)
        if offset == hi:
            return GetResult(GetStatus.NO_MESSAGE, [], offset, lo, hi)
        records: list[StoredRecord] = []
        nxt = offset
        for record in self.queues[(topic, queue_id)][offset:]:
            if len(records) >= max_count:
                break
            nxt += 1
            if (self.honor_tag_codes and tag_codes is not None
                    and tag_code(record.tag) not in tag_codes):
                continue
            records.append(record)
        status = (GetStatus.OFFSET_TOO_SMALL if corrected
                  else GetStatus.FOUND if records else GetStatus.NO_MATCHED)
        return GetResult(status, records, nxt, lo, hi)


@pytest.fixture
def store() -> FakeStore:
    return FakeStore()


@pytest.fixture
async def offsets(redis_server: RedisServer) -> AsyncIterator[OffsetStore]:
    off = OffsetStore(redis_server.url, f"test-{uuid.uuid4().hex[:8]}", "broker-a")
    await off.start()
    yield off
    await off.close()


def make_service(store: FakeStore, redis_url: str, offsets: OffsetStore,
                 clock: Callable[[], int] | None = None) -> SimpleConsumerService:
    hold = PullHold()
    store.add_listener(hold.notify)
    if clock is None:
        return SimpleConsumerService(store, redis_url, offsets.cluster, hold, offsets)
    return SimpleConsumerService(store, redis_url, offsets.cluster, hold, offsets, clock_ms=clock)


@pytest.fixture
async def svc(store: FakeStore, redis_server: RedisServer, offsets: OffsetStore, clock: FakeClock,
              ) -> AsyncIterator[SimpleConsumerService]:
    service = make_service(store, redis_server.url, offsets, clock.ms)
    yield service
    await service.close()


def bodies(got: list[Received]) -> list[str]:
    return [r.record.body.decode() for r in got]


async def test_receive_ack_commits_offset(store: FakeStore, svc: SimpleConsumerService,
                                          offsets: OffsetStore) -> None:
    for i in range(3):
        store.append("T", 0, f"m{i}")
    got = await svc.receive("G", "T", [0], max_count=10, wait_ms=0)
    assert bodies(got) == ["m0", "m1", "m2"]
    assert [r.reconsume_times for r in got] == [0, 0, 0]
    assert await svc.receive("G", "T", [0], wait_ms=0) == []  # all in flight
    assert await svc.ack("G", [got[1].receipt_handle]) == 1
    assert await offsets.get("G", "T") == {0: 0}  # m0 still in flight
    assert await svc.ack("G", [got[0].receipt_handle, got[2].receipt_handle]) == 2
    assert await offsets.get("G", "T") == {0: 3}
    assert await svc.ack("G", [h.receipt_handle for h in got]) == 0  # already acked
    assert await svc.inflight_count("G", "T") == 0


async def test_new_group_starts_at_committed_offset(store: FakeStore, svc: SimpleConsumerService,
                                                    offsets: OffsetStore) -> None:
    for i in range(5):
        store.append("T", 0, f"m{i}")
    await offsets.commit("G", [("T", 0, 3)])
    assert bodies(await svc.receive("G", "T", [0], wait_ms=0)) == ["m3", "m4"]
    store.min[("T", 1)] = 2  # retention removed the first two of queue 1
    for i in range(4):
        store.append("T", 1, f"q{i}")
    assert bodies(await svc.receive("G2", "T", [1], wait_ms=0)) == ["q2", "q3"]


async def test_expired_message_is_redelivered(store: FakeStore, svc: SimpleConsumerService,
                                              clock: FakeClock) -> None:
    store.append("T", 0, "m0")
    first = await svc.receive("G", "T", [0], invisible_ms=1000, wait_ms=0)
    assert bodies(first) == ["m0"]
    clock.wall_ms += 999
    assert await svc.receive("G", "T", [0], wait_ms=0) == []
    clock.wall_ms += 1
    again = await svc.receive("G", "T", [0], invisible_ms=1000, wait_ms=0)
    assert bodies(again) == ["m0"] and again[0].reconsume_times == 1
    assert again[0].receipt_handle != first[0].receipt_handle
    assert await svc.ack("G", [first[0].receipt_handle]) == 0  # superseded
    clock.wall_ms += 1000
    third = await svc.receive("G", "T", [0], wait_ms=0)
    assert third[0].reconsume_times == 2
    assert await svc.ack("G", [third[0].receipt_handle]) == 1


async def test_expired_but_not_redelivered_can_still_be_acked(
        store: FakeStore, svc: SimpleConsumerService, clock: FakeClock) -> None:
    store.append("T", 0, "m0")
    got = await svc.receive("G", "T", [0], invisible_ms=100, wait_ms=0)
    clock.wall_ms += 5000
    assert await svc.ack("G", [got[0].receipt_handle]) == 1
    assert await svc.receive("G", "T", [0], wait_ms=0) == []


async def test_change_invisibility(store: FakeStore, svc: SimpleConsumerService,
                                   clock: FakeClock) -> None:
    store.append("T", 0, "m0")
    got = await svc.receive("G", "T", [0], invisible_ms=1000, wait_ms=0)
    old = got[0].receipt_handle
    new = await svc.change_invisibility("G", old, 10_000)
    assert new != old
    with pytest.raises(ProtocolError) as err:
        await svc.change_invisibility("G", old, 10_000)
    assert err.value.code is ErrorCode.INVALID_RECEIPT_HANDLE
    clock.wall_ms += 5000  # past the first invisibility, inside the new one
    assert await svc.receive("G", "T", [0], wait_ms=0) == []
    assert await svc.ack("G", [old]) == 0
    clock.wall_ms += 5000  # the new invisibility ran out too: the handle stays current (as for
    newer = await svc.change_invisibility("G", new, 1000)  # ack) until a receive hands it out
    assert await svc.receive("G", "T", [0], wait_ms=0) == []  # invisible again
    clock.wall_ms += 1000
    again = await svc.receive("G", "T", [0], wait_ms=0)
    assert again[0].reconsume_times == 1
    assert await svc.ack("G", [newer]) == 0  # superseded by that delivery
    with pytest.raises(ProtocolError) as err:
        await svc.change_invisibility("G", newer, 1000)
    assert err.value.code is ErrorCode.INVALID_RECEIPT_HANDLE


async def test_invalid_handles(store: FakeStore, svc: SimpleConsumerService) -> None:
    store.append("T", 0, "m0")
    got = await svc.receive("G", "T", [0], wait_ms=0)
    handle = got[0].receipt_handle
    for bad in ["", "abc", "!!!!", handle + "A", handle[:-2], handle.swapcase(), "x" * 500]:
        with pytest.raises(ProtocolError) as err:
            await svc.ack("G", [handle, bad])
        assert err.value.code is ErrorCode.INVALID_RECEIPT_HANDLE, bad
    with pytest.raises(ProtocolError) as err:
        await svc.ack("OTHER", [handle])
    assert err.value.code is ErrorCode.INVALID_RECEIPT_HANDLE
    assert await svc.ack("G", [handle]) == 1  # nothing was acked by the refused requests


def test_receipt_round_trip_and_tampering() -> None:
    handle = encode_receipt("G", "My_Topic", 7, 123456789012, 2**64 - 1)
    assert handle.isascii() and "=" not in handle and "+" not in handle and "/" not in handle
    r = decode_receipt(handle)
    assert (r.topic, r.queue_id, r.offset, r.nonce) == ("My_Topic", 7, 123456789012, 2**64 - 1)
    assert r.belongs_to("G") and not r.belongs_to("H")
    raw = bytearray(base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4)))
    raw[3] ^= 1
    tampered = base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()
    with pytest.raises(ProtocolError):
        decode_receipt(tampered)
    with pytest.raises(ProtocolError):
        decode_receipt(None)


async def test_concurrent_receives_never_duplicate(store: FakeStore,
                                                   svc: SimpleConsumerService) -> None:
    for q in range(4):
        for i in range(50):
            store.append("T", q, f"{q}-{i}")
    results = await asyncio.gather(*(svc.receive("G", "T", [0, 1, 2, 3], max_count=16, wait_ms=0)
                                     for _ in range(20)))
    seen = [b for got in results for b in bodies(got)]
    assert len(seen) == len(set(seen)) == 200


async def test_round_robin_over_queues(store: FakeStore, svc: SimpleConsumerService) -> None:
    for q in range(2):
        for i in range(10):
            store.append("T", q, f"{q}-{i}")
    got = await svc.receive("G", "T", [0, 1], max_count=4, wait_ms=0)
    assert sorted(r.record.queue_id for r in got) == [0, 0, 1, 1]
    got = await svc.receive("G", "T", [0, 1], max_count=11, wait_ms=0)
    assert len(got) == 11
    got = await svc.receive("G", "T", [0, 1], max_count=16, wait_ms=0)
    assert len(got) == 5  # everything else


@pytest.mark.parametrize("honor", [True, False])
async def test_tag_filter(redis_server: RedisServer, offsets: OffsetStore, honor: bool) -> None:
    # honor=False: the store ignores tag codes (as on a hash collision); the exact check remains
    store = FakeStore(honor_tag_codes=honor)
    svc = make_service(store, redis_server.url, offsets)
    try:
        for tag in ["a", "c", None, "b", "c", "a"]:
            store.append("T", 0, f"{tag}", tag)
        got = await svc.receive("G", "T", [0], tags="a || b", max_count=10, wait_ms=0)
        assert bodies(got) == ["a", "b", "a"]
        assert await svc.receive("G", "T", [0], tags="a || b", wait_ms=0) == []
        assert await svc.ack("G", [r.receipt_handle for r in got]) == 3
        assert await offsets.get("G", "T") == {0: 6}  # skipped messages moved the cursor
    finally:
        await svc.close()


async def test_long_poll_wakes_on_new_message(store: FakeStore, svc: SimpleConsumerService,
                                              ) -> None:
    store.append("T", 1, "x")  # another queue: not asked for
    task = asyncio.create_task(svc.receive("G", "T", [0], wait_ms=MAX_WAIT_MS))
    await wait_until_async(lambda: svc.hold.waiter_count() == 1, what="the receive held")
    store.append("T", 0, "hello")
    assert bodies(await task) == ["hello"]
    assert svc.hold.notified == 1  # woken by the message, not by its 60 s wait running out
    assert svc.hold.waiter_count() == 0


async def test_long_poll_times_out_empty(store: FakeStore, svc: SimpleConsumerService) -> None:
    started = time.perf_counter()
    assert await svc.receive("G", "T", [0], wait_ms=100) == []
    # held for its wait_ms; ended by it (ms taken for s would hold it 100 s)
    assert 0.09 <= time.perf_counter() - started < 5.0
    assert svc.hold.waiter_count() == 0


async def test_long_poll_ignores_non_matching_tags(store: FakeStore,
                                                   svc: SimpleConsumerService) -> None:
    task = asyncio.create_task(svc.receive("G", "T", [0], tags="a", wait_ms=MAX_WAIT_MS))
    await wait_until_async(lambda: svc.hold.waiter_count() == 1, what="the receive held")
    store.append("T", 0, "skip", "b")
    await wait_until_async(lambda: svc.hold.notified == 1 and svc.hold.waiter_count() == 1,
                           what="woken, and waiting again")
    assert not task.done()  # woken, found nothing matching, still waiting
    store.append("T", 0, "take", "a")
    assert bodies(await task) == ["take"]
    assert svc.hold.notified == 2


async def test_long_poll_wakes_when_invisibility_ends(store: FakeStore, redis_server: RedisServer,
                                                      offsets: OffsetStore) -> None:
    svc = make_service(store, redis_server.url, offsets)  # wall clock
    try:
        store.append("T", 0, "m0")
        await svc.receive("G", "T", [0], invisible_ms=200, wait_ms=0)
        started = time.perf_counter()
        got = await svc.receive("G", "T", [0], wait_ms=MAX_WAIT_MS)
        assert bodies(got) == ["m0"] and got[0].reconsume_times == 1
        # back once its invisibility ended, not when the 60 s wait ran out; nothing notified it
        assert 0.1 <= time.perf_counter() - started < MAX_WAIT_MS / 1000 / 2
        assert svc.hold.notified == 0
    finally:
        await svc.close()


async def test_state_survives_a_new_service(store: FakeStore, redis_server: RedisServer,
                                            offsets: OffsetStore, clock: FakeClock) -> None:
    for i in range(4):
        store.append("T", 0, f"m{i}")
    first = make_service(store, redis_server.url, offsets, clock.ms)
    got = await first.receive("G", "T", [0], max_count=2, invisible_ms=1000, wait_ms=0)
    await first.close()
    second = make_service(store, redis_server.url, offsets, clock.ms)  # a broker restart
    try:
        m2 = await second.receive("G", "T", [0], max_count=1, invisible_ms=1000, wait_ms=0)
        assert bodies(m2) == ["m2"]
        assert await second.ack("G", [got[0].receipt_handle]) == 1
        clock.wall_ms += 1000
        again = await second.receive("G", "T", [0], max_count=10, wait_ms=0)
        assert bodies(again) == ["m1", "m2", "m3"]
        assert [r.reconsume_times for r in again] == [1, 1, 0]
    finally:
        await second.close()


async def test_bad_arguments(svc: SimpleConsumerService) -> None:
    for kwargs in ({"max_count": 0}, {"max_count": 5000}, {"invisible_ms": -1},
                   {"wait_ms": -5}):
        with pytest.raises(ProtocolError) as err:
            await svc.receive("G", "T", [0], **kwargs)  # type: ignore[arg-type]
        assert err.value.code is ErrorCode.BAD_REQUEST


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


async def test_redis_down_is_unavailable_then_recovers(store: FakeStore,
                                                       own_redis: RedisServer) -> None:
    offsets = OffsetStore(own_redis.url, "down", "broker-a")
    await offsets.start()
    svc = make_service(store, own_redis.url, offsets)
    try:
        store.append("T", 0, "m0")
        got = await svc.receive("G", "T", [0], wait_ms=0)
        own_redis.stop()
        store.append("T", 0, "m1")
        for call in (svc.receive("G", "T", [0], wait_ms=0),
                     svc.ack("G", [got[0].receipt_handle]),
                     svc.receive("G2", "T", [0], wait_ms=0)):
            with pytest.raises(ProtocolError) as err:
                await call
            assert err.value.code is ErrorCode.UNAVAILABLE
        own_redis.start()
        # m1 was never recorded as handed out, so it is served now; the ack works again
        assert bodies(await svc.receive("G", "T", [0], wait_ms=0)) == ["m1"]
        assert await svc.ack("G", [got[0].receipt_handle]) == 1
    finally:
        await svc.close()
        await offsets.close()
