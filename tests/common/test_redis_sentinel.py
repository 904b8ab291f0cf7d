"""connect_redis and the offset store against a real Sentinel-managed Redis (master, replica,
three sentinels): the client follows a failover, and a commit waits for the replica."""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from tidemq.protocol import ErrorCode, ProtocolError

from tests.support.sentinel import SentinelGroup
from tests.support.wait import wait_until_async
from tidemq_server.broker.consumers.offsets import OffsetStore
from tidemq_server.common.redis import SentinelRedis, connect_redis

pytestmark = pytest.mark.integration


@pytest.fixture
def group(tmp_path: Path) -> Iterator[SentinelGroup]:
    redis_ha = SentinelGroup(tmp_path / "ha").start()
    yield redis_ha
    redis_ha.stop()


@pytest.fixture
async def offsets(group: SentinelGroup) -> AsyncIterator[OffsetStore]:
    store = OffsetStore(group.url, f"c-{uuid.uuid4().hex[:6]}", "broker-a", wait_timeout_ms=300)
    await store.start()
    yield store
    await store.close()


async def test_client_follows_a_failover(group: SentinelGroup) -> None:
    client = connect_redis(group.url)
    assert isinstance(client, SentinelRedis)
    try:
        await client.set("before", "1")
        old = group.kill_master()
        # Issued while the sentinels have not noticed yet: it waits for the new master.
        await client.set("during", "2")
        new = group.wait_failover(old)
        assert new != old
        assert await client.get("before") == "1"
        assert await client.get("during") == "2"
        with group.data[new].client() as direct:  # it really went to the new master
            assert direct.get("during") == "2"
    finally:
        await client.aclose()


async def test_a_demoted_master_sends_the_store_to_the_new_one(group: SentinelGroup,
                                                               offsets: OffsetStore) -> None:
    """A switchover (SENTINEL FAILOVER): the old master goes on as a master without a replica
    until the sentinels reconfigure it (seconds later). The store's pooled connection still
    reaches it; the commit's WAIT finds no replica, the sentinels name the new master, and the
    commit is sent there: answered once, by the master that keeps it."""
    await offsets.commit("g", [("t", 0, 1)])
    old = group.master_port()
    with group.sentinels[0].client() as sentinel:
        sentinel.execute_command("SENTINEL", "FAILOVER", "tidemq")
    new = group.wait_failover(old)
    with group.data[old].client() as stale:
        assert stale.execute_command("ROLE")[0] == "master"  # not reconfigured yet
    await offsets.commit("g", [("t", 0, 2)])
    with group.data[new].client() as direct:
        assert direct.hgetall(offsets._key("g", "t")) == {"0": "2"}
    assert await offsets.get("g", "t") == {0: 2}


async def test_commit_waits_for_the_replica(group: SentinelGroup, offsets: OffsetStore) -> None:
    await offsets.commit("g", [("t", 0, 5)])
    assert offsets._replicas_seen == 1  # auto mode: the master's ROLE lists the replica
    replica = next(n for p, n in group.data.items() if p != group.master_port())
    assert replica.proc is not None
    replica.proc.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(ProtocolError) as err:
            await offsets.commit("g", [("t", 0, 6)])
        assert err.value.code == ErrorCode.UNAVAILABLE
        assert "acknowledged by 0 of 1 replica" in err.value.message
        offsets.wait_replicas = 0  # never wait: answered on the master's word alone
        await offsets.commit("g", [("t", 0, 7)])
        offsets.wait_replicas = -1
    finally:
        replica.proc.send_signal(signal.SIGCONT)
    await offsets.commit("g", [("t", 0, 8)])
    assert await offsets.get("g", "t") == {0: 8}
    with replica.client() as direct:  # the answered commit is on the replica
        key = offsets._key("g", "t")
        assert direct.hgetall(key) == {"0": "8"}


async def test_store_keeps_committing_across_a_failover(group: SentinelGroup,
                                                        offsets: OffsetStore) -> None:
    acked: list[int] = []
    failed: list[int] = []

    async def committer() -> None:
        for offset in range(1, 10_000):
            try:
                await offsets.commit("g", [("t", 1, offset)])
            except ProtocolError:
                failed.append(offset)
                continue
            acked.append(offset)
            if stop.is_set():
                return
            await asyncio.sleep(0.005)

    stop = asyncio.Event()
    task = asyncio.create_task(committer())
    await wait_until_async(lambda: len(acked) >= 10, what="commits before the failover")
    old = group.kill_master()
    await asyncio.to_thread(group.wait_failover, old)
    resumed = len(acked) + 10
    await wait_until_async(lambda: len(acked) >= resumed, what="commits after the failover")
    stop.set()
    await task
    assert len(acked) > 20
    # A commit waits for the new master (failover ~2.5 s, the wait 10 s): none should fail; one
    # may, should the failover outlast the wait on a loaded machine.
    assert len(failed) <= 1, failed
    assert await offsets.get("g", "t") == {1: acked[-1]}
