"""Three push consumers join and leave one clustering group while a producer keeps sending.

Timeline: c1 alone → c2 (in process) and c3 (child process) join → c2 closes → c3 is SIGKILLed
(its heartbeats stop; the broker's 3 s member expiry drops it) → c1 alone → c1 closes and a new
consumer c4 of the same group takes over. Between membership changes the test waits until the
group has settled (every member sees the same members; the assignments are disjoint and cover
every queue) and then lets messages flow for a while: a *stable window*.

Checked: every acknowledged message is processed at least once; no message is processed twice
inside a stable window; all repeats happen around a membership change and stay few; c4 does
not process again what the group committed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tidemq import Producer, PushConsumer

from tests.support.procs import RedisServer
from tests.support.wait import quiet_for_async, wait_until_async
from tests.system.sdk_harness import (
    FAST_CONSUMER,
    ConsumerProcess,
    Flow,
    Recorder,
    SdkCluster,
    repeated,
    run_cluster,
    unique,
)

pytestmark = pytest.mark.integration

QUEUES = 8
STABLE_S = 1.0  # how long each stable window lasts at least
WINDOW_MIN = 20  # ... and until more messages than this were processed in it
SETTLE_MARGIN_S = 0.3  # after the group settled, before the stable window starts


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory,
            redis_server: RedisServer) -> Iterator[SdkCluster]:
    with run_cluster(tmp_path_factory.mktemp("churn"), redis_server.url,
                     consumer_expiry_s=3.0, group_expiry_interval_s=0.5) as handle:
        yield handle


async def test_three_consumers_join_and_leave_while_messages_flow(
        cluster: SdkCluster, tmp_path: Path) -> None:
    topic = cluster.create_topic(queues=QUEUES)
    group = unique("G")
    all_queues = cluster.queue_names(topic)
    assert len(all_queues) == QUEUES
    recorder = Recorder()
    ns = cluster.nameservers

    def consumer(name: str) -> PushConsumer:
        c = PushConsumer(group, handler=recorder.handler(name), nameservers=ns,
                         client_id=f"{name}-{unique('c')}", **FAST_CONSUMER)
        c.subscribe(topic)
        return c

    c1, c2 = consumer("c1"), consumer("c2")
    c3 = ConsumerProcess("c3", tmp_path / "c3.jsonl", ns, group, topic)
    live: list[PushConsumer] = []
    child_live = False
    changes: list[float] = []  # when membership changed
    windows: list[tuple[float, float]] = []  # stable windows

    def settled() -> bool:
        ids = {c.client_id for c in live} | ({c3.client_id} if child_live else set())
        owned = [set(map(str, c.assignment)) for c in live]
        if child_live:
            owned.append(set(c3.assignment()))
        union = set().union(*owned)
        return (all(set(c.members) == ids for c in live) and union == all_queues
                and sum(map(len, owned)) == len(all_queues))

    async def stable_window(why: str) -> None:
        await wait_until_async(settled, 15, f"the group to settle ({why})")
        await asyncio.sleep(SETTLE_MARGIN_S)
        start = time.monotonic()
        assert await quiet_for_async(settled, STABLE_S, f"the group settled ({why})")
        # at least STABLE_S, and until enough has flowed to show repeats (a loaded machine
        # may process little in one second; a stuck group fails here)
        await wait_until_async(
            lambda: sum(e.at >= start for e in (*recorder.events, *c3.events())) > WINDOW_MIN,
            what=f"messages to flow ({why})", every=0.1)
        windows.append((start, time.monotonic()))

    flow = Flow(Producer(nameservers=ns), topic)  # about 160 messages per second
    sender: asyncio.Task[None] | None = None
    flow_started = time.monotonic()
    try:
        await c1.start()
        live.append(c1)
        sender = asyncio.create_task(flow.run())
        await stable_window("c1 alone")

        changes.append(time.monotonic())
        c3.start()
        await c2.start()
        live.append(c2)
        await wait_until_async(c3.ready, 15, "the consumer process to start")
        child_live = True
        await stable_window("c1, c2, c3")

        changes.append(time.monotonic())
        await c2.close()
        live.remove(c2)
        await stable_window("c2 closed")

        changes.append(time.monotonic())
        c3.kill()
        child_live = False
        await stable_window("c3 killed")

        flow.stopped.set()
        await sender
        rate = len(flow.acked) / (time.monotonic() - flow_started)
        sent = set(flow.acked)

        def everything_processed() -> bool:
            return sent <= recorder.bodies() | {e.body for e in c3.events()}

        await wait_until_async(everything_processed, 15, "every acked message to be processed")
        await c1.close()
    finally:
        flow.stopped.set()
        if sender is not None:
            await asyncio.gather(sender, return_exceptions=True)
        c3.kill()
        for c in (c1, c2):
            await c.close()
        await flow.producer.close()

    events = recorder.events + c3.events()
    by_consumer = {name: sum(e.consumer == name for e in events) for name in ("c1", "c2", "c3")}
    assert all(by_consumer.values()), f"a consumer processed nothing: {by_consumer}"
    assert len(sent) == len(flow.acked), "the producer acked one body twice"
    assert {e.body for e in events} == sent

    for start, end in windows:
        flowing = sum(start <= e.at <= end for e in events)
        assert flowing > WINDOW_MIN, f"only {flowing} messages processed in a stable window"
    repeats = repeated(events)
    in_windows = [e for e in repeats if any(a <= e.at <= b for a, b in windows)]
    assert not in_windows, f"processed twice while the group was stable: {in_windows[:5]}"
    for event in repeats:
        assert any(t <= event.at for t in changes), f"a repeat before any change: {event}"
    # A rebalance may redo what the new owner's committed offset lags behind (a commit
    # interval) plus what the old owner consumes until its next heartbeat. Four rebalances:
    # c2 joins, c3 joins, c2 leaves, c3 expires.
    per_rebalance = rate * (FAST_CONSUMER["heartbeat_interval_s"]
                            + FAST_CONSUMER["offset_commit_interval_s"] + 0.2)
    assert len(repeats) <= 4 * per_rebalance, (len(repeats), len(sent), rate)

    # offsets resumed: everything is committed, and a new member processes only new messages
    assert cluster.committed(group, topic) == cluster.max_offsets(topic)
    fresh = Recorder()
    c4 = PushConsumer(group, handler=fresh.handler("c4"), nameservers=ns, **FAST_CONSUMER)
    c4.subscribe(topic)
    async with Producer(nameservers=ns) as producer, c4:
        new = [f"new-{i}" for i in range(40)]
        await asyncio.gather(*(producer.send(b, topic=topic) for b in new))
        await wait_until_async(lambda: fresh.bodies() >= set(new), 10, "c4 to process the new ones")
        # time enough for an old message to show up: nothing more within half a second
        await quiet_for_async(lambda: len(fresh.events), 0.5, "deliveries")
    assert sorted(e.body for e in fresh.events) == sorted(new)

