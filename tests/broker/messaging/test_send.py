"""The send path's pure parts and SendService over an in-memory store: queue selection, delays,
de-duplication (recent map, in-batch, in flight, index fallback) and status mapping."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from tidemq.protocol import UNIQ_KEY, ErrorCode, Limits, Perm, ProtocolError

from tidemq_server.broker.delays.routing import DELAY_LEVEL_TOPIC, INTAKE_TOPIC, DelayRouter
from tidemq_server.broker.ingest.dedup import DedupCache, Placed
from tidemq_server.broker.ingest.writes import Ingest
from tidemq_server.broker.messaging.send import SendService
from tidemq_server.broker.messaging.topics import TopicManager
from tidemq_server.broker.observability import BrokerMetrics
from tidemq_server.broker.store.types import (
    Appended,
    MessageRecord,
    PutResult,
    PutStatus,
    StoredRecord,
)
from tidemq_server.common.clock import now_ms

LEVELS_MS = (1000, 5000)  # a two-level delay table


class MemoryStore:
    """The store and appender the send path uses, in memory; ``gate`` holds appends; ``settle``
    answers ``settle_status`` (a replicated group's gate may say NOT_ENOUGH_REPLICAS)."""

    def __init__(self) -> None:
        self.records: list[StoredRecord] = []
        self.next: dict[tuple[str, int], int] = {}
        self.status = PutStatus.OK
        self.gate: asyncio.Event | None = None
        self.puts = 0
        self.settled: list[int] = []  # ends a dedup hit from the index asked to settle
        self.settle_status = PutStatus.OK

    async def append(self, records: list[MessageRecord]) -> PutResult:
        self.puts += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.status is not PutStatus.OK:
            return PutResult(self.status, message="test")
        out = []
        for r in records:
            offset = self.next.get((r.topic, r.queue_id), 0)
            self.next[(r.topic, r.queue_id)] = offset + 1
            phys = len(self.records)
            self.records.append(StoredRecord(phys, 1, r.topic, r.queue_id, offset, r.body,
                                             dict(r.properties), 0, 0, r.born_timestamp,
                                             r.born_host, now_ms(), "h:1", 0, 0))
            out.append(Appended(phys, 1, r.queue_id, offset, now_ms()))
        return PutResult(PutStatus.OK, out)

    def stop_tracking_recent_keys(self) -> None:
        pass  # no recent-key filter here

    def find_by_unique_key(self, message_id: str, *, whole_log: bool = False,
                           since_ms: int | None = None) -> list[StoredRecord]:
        return [r for r in self.records if r.message_id == message_id]

    async def settle(self, end: int) -> PutStatus:
        self.settled.append(end)
        return self.settle_status


@pytest.fixture
async def service(tmp_path: Path) -> tuple[SendService, MemoryStore]:
    topics = TopicManager(tmp_path)
    await topics.put("T", 4, Perm.READ_WRITE)
    store = MemoryStore()
    router = DelayRouter(LEVELS_MS, Limits().max_delay_ms)
    ingest = Ingest(store, store, DedupCache(600, 1000, 0), BrokerMetrics(),  # type: ignore
                    router.waiting)
    svc = SendService(ingest, topics, Limits(), router)
    return svc, store


def msgs(*items: dict[str, Any]) -> dict[str, Any]:
    return {"messages": list(items)}


async def test_results_in_request_order_and_round_robin(service: Any) -> None:
    svc, store = service
    results = await svc.send("T", msgs(*({"body": str(i)} for i in range(8))), "1.2.3.4:5")
    assert sorted(r["queue_id"] for r in results) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert store.puts == 1  # one store write per request
    assert [r.body for r in store.records] == [str(i).encode() for i in range(8)]
    assert store.records[0].born_host == "1.2.3.4:5"


async def test_sharding_key_and_explicit_queue(service: Any) -> None:
    svc, _ = service
    a = await svc.send("T", msgs(*({"body": "x", "sharding_key": "k"} for _ in range(5))), "")
    assert len({r["queue_id"] for r in a}) == 1
    b = await svc.send("T", msgs({"body": "x", "queue_id": 3}), "")
    assert b[0]["queue_id"] == 3
    with pytest.raises(ProtocolError) as err:
        await svc.send("T", msgs({"body": "x", "queue_id": 4}), "")
    assert err.value.code is ErrorCode.BAD_REQUEST


async def test_dedup_retry_in_batch_and_index(service: Any) -> None:
    svc, store = service
    batch = msgs({"message_id": "a", "body": "1"}, {"message_id": "b", "body": "2"},
                 {"message_id": "a", "body": "1"})
    first = await svc.send("T", batch, "")
    assert first[0] == first[2] and len(store.records) == 2
    assert await svc.send("T", batch, "") == first
    assert len(store.records) == 2
    # a fresh cache (a restart) finds them through the store's index
    svc.ingest.dedup = DedupCache(600, 1000, now_ms())
    assert await svc.send("T", batch, "") == first
    assert len(store.records) == 2


async def test_an_unacknowledged_first_copy_is_found_and_settled(service: Any) -> None:
    """A write answered NOT_ENOUGH_REPLICAS may be in the log: the retry finds it through the
    index, asks the store to settle it (the write gate: quorum, primary) and only then answers
    its first place; a settle that fails answers the error and remembers nothing."""
    svc, store = service
    store.status = PutStatus.NOT_ENOUGH_REPLICAS
    with pytest.raises(ProtocolError):
        await svc.send("T", msgs({"message_id": "u", "body": "1", "queue_id": 1}), "")
    store.status = PutStatus.OK
    # as if the failed write had reached the log (the gate writes, then waits for copies)
    await store.append([MessageRecord("T", 1, b"1", {UNIQ_KEY: "u"})])
    store.settle_status = PutStatus.NOT_ENOUGH_REPLICAS
    with pytest.raises(ProtocolError) as err:
        await svc.send("T", msgs({"message_id": "u", "body": "1", "queue_id": 1}), "")
    assert err.value.code is ErrorCode.NOT_ENOUGH_REPLICAS
    store.settle_status = PutStatus.OK
    again = await svc.send("T", msgs({"message_id": "u", "body": "1", "queue_id": 1}), "")
    assert again == [{"message_id": "u", "queue_id": 1, "queue_offset": 0}]
    assert len(store.records) == 1 and store.settled == [1, 1]
    # remembered once settled: the next retry needs neither the index nor a settle
    await svc.send("T", msgs({"message_id": "u", "body": "1", "queue_id": 1}), "")
    assert len(store.records) == 1 and store.settled == [1, 1]


async def test_concurrent_duplicates_wait_for_the_first(service: Any) -> None:
    svc, store = service
    store.gate = asyncio.Event()
    batch = msgs({"message_id": "x", "body": "1"}, {"message_id": "y", "body": "2"})
    first = asyncio.create_task(svc.send("T", batch, ""))
    await asyncio.sleep(0)
    second = asyncio.create_task(svc.send("T", batch, ""))
    await asyncio.sleep(0)
    store.gate.set()
    assert await first == await second
    assert len(store.records) == 2


async def test_a_cancelled_request_still_settles_its_write(service: Any) -> None:
    svc, store = service
    store.gate = asyncio.Event()
    batch = msgs({"message_id": "x", "body": "1"})
    first = asyncio.create_task(svc.send("T", batch, ""))
    await asyncio.sleep(0.01)  # its write waits in the store
    first.cancel()  # the client went away
    second = asyncio.create_task(svc.send("T", batch, ""))
    await asyncio.sleep(0.01)
    store.gate.set()
    answer = await second
    assert answer[0]["queue_offset"] == 0 and len(store.records) == 1
    assert await svc.send("T", batch, "") == answer
    assert len(store.records) == 1


async def test_failed_store_fails_the_waiters_too(service: Any) -> None:
    svc, store = service
    store.gate = asyncio.Event()
    store.status = PutStatus.BUSY
    batch = msgs({"message_id": "x", "body": "1"})
    first = asyncio.create_task(svc.send("T", batch, ""))
    await asyncio.sleep(0)
    second = asyncio.create_task(svc.send("T", batch, ""))
    await asyncio.sleep(0)
    store.gate.set()
    for task in (first, second):
        with pytest.raises(ProtocolError) as err:
            await task
        assert err.value.code is ErrorCode.BROKER_BUSY
    store.status, store.gate = PutStatus.OK, None
    assert (await svc.send("T", batch, ""))[0]["queue_offset"] == 0  # nothing remembered


async def test_a_bad_message_rejects_the_whole_batch(service: Any) -> None:
    svc, store = service
    with pytest.raises(ProtocolError) as err:
        await svc.send("T", msgs({"body": "ok"}, {"body": "x", "delay_level": 3}), "")
    assert err.value.code is ErrorCode.INVALID_DELAY
    assert store.puts == 0


async def test_delayed_messages_are_stored_as_waiting_copies(service: Any) -> None:
    svc, store = service
    past = now_ms() - 1
    await svc.send("T", msgs({"body": "now"}, {"body": "past", "deliver_at_ms": past},
                             {"body": "level", "delay_level": 2},
                             {"body": "timer", "delay_ms": 60_000}), "")
    assert [(r.topic, r.body) for r in store.records] == [
        ("T", b"now"), ("T", b"past"), (DELAY_LEVEL_TOPIC, b"level"), (INTAKE_TOPIC, b"timer")]
    for bad in ({"delay_level": 3}, {"delay_ms": Limits().max_delay_ms + 1},
                {"delay_level": 1, "delay_ms": 5}):
        with pytest.raises(ProtocolError) as err:
            await svc.send("T", msgs({"body": "x", **bad}), "")
        assert err.value.code is ErrorCode.INVALID_DELAY
    assert len(store.records) == 4


async def test_a_retry_after_the_due_time_finds_the_waiting_copy(service: Any) -> None:
    """A delayed send whose answer was lost, retried once its due time has passed, is not
    routed to the scheduler but stored in its topic at once: it must still find the waiting
    copy of its first attempt (the faults suite saw both delivered)."""
    svc, store = service
    due = now_ms() + 60_000
    first = await svc.send("T", msgs({"message_id": "w", "body": "x", "deliver_at_ms": due}), "")
    assert first[0]["state"] == "scheduled" and store.records[0].topic == INTAKE_TOPIC
    late = msgs({"message_id": "w", "body": "x", "deliver_at_ms": now_ms() - 1})
    assert (await svc.send("T", late, ""))[0]["deliver_at_ms"] == due
    svc.ingest.dedup = DedupCache(600, 1000, now_ms())  # a promoted replica: found in the index
    assert (await svc.send("T", late, ""))[0]["deliver_at_ms"] == due
    assert len(store.records) == 1


def test_dedup_cache_window_and_size_bound() -> None:
    cache = DedupCache(window_s=1, max_entries=2, started_ms=0)
    assert cache.needs_index(500) and not cache.needs_index(1001)
    cache.remember(("T", "a"), Placed(0, 1), 2000)
    assert cache.lookup(("T", "a"), 2500) == Placed(0, 1)
    assert cache.lookup(("T", "a"), 3001) is None  # outside the window
    cache.remember(("T", "b"), Placed(0, 2), 2600)
    cache.remember(("T", "c"), Placed(0, 3), 2700)  # evicts a, still inside its window
    assert len(cache) == 2 and cache.needs_index(2900) and not cache.needs_index(3001)
    cache.expire(3650)
    assert len(cache) == 1
    assert not DedupCache(0, 10, 0).enabled
