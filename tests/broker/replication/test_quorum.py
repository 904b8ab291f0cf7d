"""Quorum arithmetic: acknowledgements, the in-sync set, the high-water mark, sync waits; the
write gate and the visibility of records (units, with a fake clock and fake store parts)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.support.clock import FakeClock
from tidemq_server.broker.replication.epochs import EpochFile
from tidemq_server.broker.replication.gate import WriteGate
from tidemq_server.broker.replication.quorum import Quorum, kth_largest
from tidemq_server.broker.replication.role import BrokerRole, Role
from tidemq_server.broker.replication.visibility import Visibility
from tidemq_server.broker.store.types import Appended, MessageRecord, PutResult, PutStatus


def quorum(k: int = 2, *, sync: bool = True, durable: bool = False) -> tuple[Quorum, FakeClock]:
    clock = FakeClock()
    return Quorum(k, lag_max_s=1.0, durable=durable, sync=sync, clock=clock), clock


def test_kth_largest() -> None:
    assert kth_largest([5, 9, 1], 1) == 9
    assert kth_largest([5, 9, 1], 2) == 5
    assert kth_largest([5, 9, 1], 3) == 1
    assert kth_largest([5], 2) is None


def test_hwm_is_the_quorum_th_largest_acknowledgement_and_never_moves_back() -> None:
    q, _clock = quorum(2)
    moved: list[int] = []
    q.add_listener(moved.append)
    assert q.advance(1000) == 0  # the primary alone is not a quorum of 2
    q.on_fetch(1, "r1", 400, 0, 1, 1000)
    assert q.advance(1000) == 400
    q.on_fetch(2, "r2", 700, 0, 1, 1000)
    assert q.advance(1000) == 700  # sorted [1000, 700, 400]: the 2nd
    q.on_fetch(2, "r2", 100, 0, 1, 1000)  # r2 restarted empty
    assert q.advance(1000) == 700
    assert moved == [400, 700]


def test_durable_counts_the_flushed_offset() -> None:
    q, _ = quorum(2, durable=True)
    q.on_fetch(1, "r1", 900, 300, 1, 1000)
    assert q.advance(1000) == 300


def test_in_sync_means_caught_up_within_the_lag_time() -> None:
    q, clock = quorum(2)
    r = q.on_fetch(1, "r1", 0, 0, 1, 5000)  # far behind
    assert q.insync_copies() == 1 and not q.enough()
    q.answered(r, 5000)
    clock.now += 0.1
    q.on_fetch(1, "r1", 5000, 0, 1, 6000)  # reached where the last answer ended
    assert q.insync_copies() == 2 and q.enough()
    clock.now += 1.5  # silent past the lag time
    assert q.insync_copies() == 1 and not q.enough()
    q2, _ = quorum(2, sync=False)
    assert q2.enough()  # async never refuses for want of replicas


def test_async_shrinks_the_quorum_to_the_live_copies() -> None:
    q, _clock = quorum(2, sync=False)
    assert q.advance(800) == 800  # no replica alive: the primary alone
    q.on_fetch(1, "r1", 300, 0, 1, 900)
    assert q.advance(900) == 800  # never back; k = 2 now: min(900, 300) < 800
    q.on_fetch(1, "r1", 900, 0, 1, 900)
    assert q.advance(900) == 900


async def test_wait_for_settles_on_the_hwm_or_on_too_few_copies() -> None:
    q, clock = quorum(2)
    r = q.on_fetch(1, "r1", 0, 0, 1, 0)
    q.answered(r, 0)
    waiter = asyncio.create_task(q.wait_for(500, 5.0))
    await asyncio.sleep(0)
    q.on_fetch(1, "r1", 500, 0, 1, 500)
    q.advance(500)
    assert await waiter is True
    lost = asyncio.create_task(q.wait_for(900, 5.0))
    await asyncio.sleep(0)
    clock.now += 2.0  # the replica went silent
    q.advance(900)
    assert await lost is False
    assert await q.wait_for(2000, 0.01) is False  # timeout
    assert q.waiting() == 0


def make_role(tmp_path: Path, role: Role = Role.PRIMARY) -> BrokerRole:
    return BrokerRole(EpochFile(tmp_path / "e.json"), "http://me", lambda: 0, role, 1,
                      "http://p" if role == Role.REPLICA else None)


class FakeWriter:
    def __init__(self) -> None:
        self.calls = 0

    async def append(self, records: list[MessageRecord]) -> PutResult:
        self.calls += 1
        return PutResult(PutStatus.OK, [Appended(100, 50, 0, 0, 0)])


async def test_gate_refuses_before_writing_and_fences_before_answering(tmp_path: Path) -> None:
    q, _clock = quorum(2)
    store = FakeWriter()
    woke: list[int] = []
    role = make_role(tmp_path)
    gate = WriteGate(store, role, q, lambda: woke.append(1), timeout_s=0.05)
    rec = [MessageRecord("T", 0, b"x")]
    res = await gate.append(rec)
    assert res.status is PutStatus.NOT_ENOUGH_REPLICAS and store.calls == 0
    assert "nothing was written" in res.message
    r = q.on_fetch(1, "r1", 0, 0, 1, 0)  # caught up with an empty log
    q.answered(r, 0)
    res = await gate.append(rec)  # written, but the replica never acknowledges 150
    assert res.status is PutStatus.NOT_ENOUGH_REPLICAS and store.calls == 1 and woke == [1]
    assert "not acknowledged" in res.message
    q.on_fetch(1, "r1", 150, 0, 1, 150)
    q.advance(150)
    assert (await gate.append(rec)).status is PutStatus.OK
    role.fence = lambda: False
    res = await gate.append(rec)
    assert res.status is PutStatus.NOT_PRIMARY and "lease" in res.message
    replica = WriteGate(store, make_role(tmp_path / "r", Role.REPLICA), q, lambda: None, 1)
    res = await replica.append(rec)
    assert res.status is PutStatus.NOT_PRIMARY and "http://p" in res.message
    assert gate.stats["refused_not_enough_replicas"] == 2


class Log:
    write_offset = 0


class Store:
    def __init__(self) -> None:
        self.log = Log()
        self.visible_offset: int | None = None

    def limit_reads(self, offset: int | None) -> None:
        self.visible_offset = offset


def test_visibility_holds_wakeups_until_the_hwm_passes() -> None:
    woken: list[set[Any]] = []
    store = Store()
    vis = Visibility(store, woken.append)  # type: ignore[arg-type]
    vis.activate()
    assert store.visible_offset == 0
    store.log.write_offset = 100
    vis.on_write({("T", 0)})
    store.log.write_offset = 200
    vis.on_write({("T", 1)})
    assert woken == []
    vis.advance(150)
    assert woken == [{("T", 0)}] and store.visible_offset == 150
    vis.advance(120)  # never back
    assert store.visible_offset == 150
    vis.advance(200)
    assert woken[-1] == {("T", 1)}
    store.log.write_offset = 210
    vis.reset(180)
    vis.on_write({("T", 2)})
    assert store.visible_offset == 180 and len(woken) == 2


def test_an_inactive_visibility_never_limits_reads() -> None:
    store = Store()
    vis = Visibility(store, lambda keys: None)  # type: ignore[arg-type]
    vis.advance(500)  # a fetch on a broker without replication moves the mark...
    vis.reset(100)
    assert store.visible_offset is None  # ...but its reads stay unlimited


async def test_a_demotion_waits_for_writes_already_let_through(tmp_path: Path) -> None:
    release = asyncio.Event()

    class SlowWriter:
        async def append(self, records: list[MessageRecord]) -> PutResult:
            await release.wait()
            return PutResult(PutStatus.OK, [Appended(0, 10, 0, 0, 0)])

    q, _ = quorum(1)
    role = make_role(tmp_path)
    gate = WriteGate(SlowWriter(), role, q, lambda: None, timeout_s=0.05)
    put = asyncio.create_task(gate.append([MessageRecord("T", 0, b"x")]))
    await asyncio.sleep(0)
    drained = asyncio.create_task(gate.drained())
    role.role = Role.REPLICA  # demoted while the write is in the writer
    await asyncio.sleep(0.01)
    assert gate.writing == 1 and not drained.done()
    release.set()
    await drained
    assert (await put).status is PutStatus.NOT_PRIMARY  # written, never acknowledged
    await gate.drained()  # nothing in flight: at once
