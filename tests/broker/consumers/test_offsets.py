"""OffsetStore against a real redis-server: commit/get, coalescing, restart, outage."""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from tidemq.protocol import ErrorCode, ProtocolError

from tests.support.procs import RedisServer
from tests.support.wait import HANG_S
from tidemq_server.broker.consumers.offsets import OffsetStore

pytestmark = pytest.mark.integration


@pytest.fixture
async def offsets(redis_server: RedisServer) -> AsyncIterator[OffsetStore]:
    store = OffsetStore(redis_server.url, f"test-{uuid.uuid4().hex[:8]}", "broker-a")
    await store.start()
    yield store
    await store.close()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


async def test_commit_then_get(offsets: OffsetStore) -> None:
    assert await offsets.get("G", "T") == {}
    assert await offsets.topics("G") == []
    await offsets.commit("G", [("T", 0, 5), ("T", 1, 7), ("U", 3, 1)])
    assert await offsets.get("G", "T") == {0: 5, 1: 7}
    assert await offsets.get("G", "U") == {3: 1}
    assert await offsets.topics("G") == ["T", "U"]
    await offsets.commit("G", [("T", 0, 9)])
    assert await offsets.get("G", "T") == {0: 9, 1: 7}
    assert await offsets.get("other", "T") == {}


async def test_a_commit_never_moves_an_offset_back(offsets: OffsetStore) -> None:
    """A commit delayed behind a partition and written late must not undo a newer one (the
    faults suite read back 31 after 44 was committed); only a reset rewinds."""
    await offsets.commit("G", [("T", 0, 44), ("T", 1, 5)], advance_only=True)
    # the late one, and a newer one
    await offsets.commit("G", [("T", 0, 31), ("T", 1, 6)], advance_only=True)
    assert await offsets.get("G", "T") == {0: 44, 1: 6}
    await offsets.commit("G", [("T", 0, 10)])  # a plain commit sets (an operator's reset)
    assert await offsets.get("G", "T") == {0: 10, 1: 6}
    await offsets.reset("G", "T", {0: 3})
    await offsets.commit("G", [("T", 0, 12)], advance_only=True)
    assert await offsets.get("G", "T") == {0: 12}


async def test_reset_and_delete_group(offsets: OffsetStore) -> None:
    await offsets.commit("G", [("T", 0, 5), ("T", 1, 7), ("U", 0, 2)])
    await offsets.reset("G", "T", {2: 3})
    assert await offsets.get("G", "T") == {2: 3}
    await offsets.reset("G", "U", {})
    assert await offsets.topics("G") == ["T"]
    await offsets.delete_group("G")
    assert await offsets.topics("G") == []
    assert await offsets.get("G", "T") == {}


async def test_negative_offset_refused(offsets: OffsetStore) -> None:
    with pytest.raises(ProtocolError) as err:
        await offsets.commit("G", [("T", 0, -1)])
    assert err.value.code is ErrorCode.BAD_REQUEST


async def test_concurrent_commits_share_round_trips(offsets: OffsetStore) -> None:
    before = offsets.round_trips
    await asyncio.gather(*(offsets.commit(f"G{i % 10}", [("T", i % 8, i)]) for i in range(200)))
    trips = offsets.round_trips - before
    assert trips <= 5, f"200 commits took {trips} round trips"
    for g in range(10):
        got = await offsets.get(f"G{g}", "T")
        # per (group, queue) the last commit in submission order wins
        expected = {q: max(i for i in range(200) if i % 10 == g and i % 8 == q)
                    for q in range(8) if any(i % 10 == g and i % 8 == q for i in range(200))}
        assert got == expected


async def test_writes_apply_in_submission_order(offsets: OffsetStore) -> None:
    await asyncio.gather(
        offsets.commit("G", [("T", 0, 10)]),
        offsets.reset("G", "T", {0: 3}),
        offsets.commit("G", [("T", 1, 4)]),
    )
    assert await offsets.get("G", "T") == {0: 3, 1: 4}


async def test_cancelled_commit_does_not_break_the_writer(offsets: OffsetStore) -> None:
    task = asyncio.create_task(offsets.commit("G", [("T", 0, 1)]))
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await offsets.commit("G", [("T", 0, 2)])
    assert await offsets.get("G", "T") == {0: 2}


async def test_redis_restart_loses_no_committed_offset(own_redis: RedisServer) -> None:
    store = OffsetStore(own_redis.url, "restart", "broker-a")
    await store.start()
    try:
        await asyncio.gather(*(store.commit("G", [("T", q, 100 + q)]) for q in range(8)))
        own_redis.stop()
        own_redis.start()  # same port, same dir: the append-only file brings the data back
        assert await store.get("G", "T") == {q: 100 + q for q in range(8)}
        await store.commit("G", [("T", 0, 200)])
        assert (await store.get("G", "T"))[0] == 200
    finally:
        await store.close()


async def test_outage_is_unavailable_then_recovers(own_redis: RedisServer) -> None:
    store = OffsetStore(own_redis.url, "outage", "broker-a")
    await store.start()
    try:
        await store.commit("G", [("T", 0, 1)])
        own_redis.stop()
        async with asyncio.timeout(HANG_S):  # every answer comes; none hangs
            with pytest.raises(ProtocolError) as err:
                await store.commit("G", [("T", 0, 2)])
            assert err.value.code is ErrorCode.UNAVAILABLE
            assert "Redis unreachable" in err.value.message
            with pytest.raises(ProtocolError) as err:
                await store.get("G", "T")
            assert err.value.code is ErrorCode.UNAVAILABLE
            # concurrent commits during the outage all fail
            results = await asyncio.gather(
                *(store.commit("G", [("T", 1, i)]) for i in range(20)), return_exceptions=True)
        assert all(isinstance(r, ProtocolError) and r.code is ErrorCode.UNAVAILABLE
                   for r in results)
        own_redis.start()
        await store.commit("G", [("T", 0, 3)])
        assert await store.get("G", "T") == {0: 3}
    finally:
        await store.close()


async def test_commit_after_close_is_unavailable(redis_server: RedisServer) -> None:
    store = OffsetStore(redis_server.url, "closed", "broker-a")
    await store.start()
    await store.close()
    with pytest.raises(ProtocolError) as err:
        await store.commit("G", [("T", 0, 1)])
    assert err.value.code is ErrorCode.UNAVAILABLE


async def test_hung_redis_times_out_then_recovers(own_redis: RedisServer) -> None:
    store = OffsetStore(own_redis.url, "hung", "broker-a", timeout_s=0.3)
    await store.start()
    assert own_redis.proc is not None
    try:
        await store.commit("G", [("T", 0, 1)])
        own_redis.proc.send_signal(signal.SIGSTOP)  # alive but silent: only a timeout tells
        try:
            # answered by its timeouts, not held until SIGCONT
            with pytest.raises(ProtocolError) as err:
                async with asyncio.timeout(HANG_S):
                    await store.commit("G", [("T", 0, 2)])
            assert err.value.code is ErrorCode.UNAVAILABLE
        finally:
            own_redis.proc.send_signal(signal.SIGCONT)
        await store.commit("G", [("T", 0, 3)])  # the writer is not wedged
        assert await store.get("G", "T") == {0: 3}
    finally:
        await store.close()
