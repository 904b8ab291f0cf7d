"""The SDK across failures of the processes behind it: a broker restarted mid-stream (SIGTERM
and SIGKILL) and a Redis restart mid-run.

A broker restart: sends in flight ride on the SDK's retries (until their deadline, longer than
the outage: no send fails; the application's own resend with the same message id stays as a
safety net); the push consumer resumes. No acknowledged send is lost and none is stored twice.

A Redis restart (SIGTERM or SIGKILL; Redis runs with an append-only file, which it writes
before answering): sends and pulls go on while Redis is down (only offset commits wait), no
committed offset is lost, and commits resume once Redis is back.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tidemq import Producer, PushConsumer

from tests.support.procs import RedisServer
from tests.support.wait import quiet_for_async, wait_until_async
from tests.system.sdk_harness import FAST_CONSUMER, Flow, Recorder, SdkCluster, run_cluster, unique

pytestmark = pytest.mark.integration

DOWN_S = 2.5  # a stopped broker stays down this long (less than the SDK's retry deadline)


def consumer(cluster: SdkCluster, group: str, topic: str, recorder: Recorder,
             name: str) -> PushConsumer:
    c = PushConsumer(group, handler=recorder.handler(name), nameservers=cluster.nameservers,
                     **FAST_CONSUMER)
    c.subscribe(topic)
    return c


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
async def test_broker_restart_mid_stream(tmp_path: Path, redis_server: RedisServer,
                                         sig: signal.Signals) -> None:
    with run_cluster(tmp_path, redis_server.url) as cluster:
        topic = cluster.create_topic(queues=4)
        group = unique("G")
        recorder = Recorder()
        push = consumer(cluster, group, topic, recorder, "c1")
        flow = Flow(Producer(nameservers=cluster.nameservers), topic, resend=True)
        sender = None
        try:
            await push.start()
            sender = asyncio.create_task(flow.run())
            await wait_until_async(lambda: len(recorder.events) >= 100, 10, "consumption to start")

            await asyncio.to_thread(cluster.broker.proc.stop, sig)
            await asyncio.sleep(DOWN_S)  # sends wait meanwhile, within their retry deadline
            await asyncio.to_thread(cluster.broker.proc.start)
            restarted = time.monotonic()
            await wait_until_async(lambda: flow.acked_since(restarted) >= 100, 20,
                                   "sends to succeed again after the restart")
            await wait_until_async(
                lambda: sum(e.at >= restarted for e in recorder.events) >= 100, 20,
                "the consumer to resume after the restart")
            flow.stopped.set()
            await sender
            acked = set(flow.acked)
            await wait_until_async(lambda: acked <= recorder.bodies(), 20,
                                   "every acknowledged message to be consumed")
        finally:
            flow.stopped.set()
            if sender is not None:
                await asyncio.gather(sender, return_exceptions=True)
            await push.close()
            await flow.producer.close()

        # the SDK's own retries (a 30 s deadline) outlast the outage: the application's resend
        # is never needed (tests/system/test_sdk_ride_restart.py covers more kinds of calls)
        assert flow.failures == 0, f"{flow.failures} sends failed during a {DOWN_S}s restart"
        assert len(acked) == len(flow.acked), "one body was acknowledged twice"
        assert recorder.bodies() == acked
        assert sum(cluster.max_offsets(topic).values()) == len(acked), "a resend stored twice"
        assert cluster.committed(group, topic) == cluster.max_offsets(topic)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
async def test_redis_restart_mid_run(tmp_path: Path, private_redis: RedisServer,
                                     sig: signal.Signals) -> None:
    with run_cluster(tmp_path, private_redis.url) as cluster:
        topic = cluster.create_topic(queues=4)
        group = unique("G")
        recorder = Recorder()
        push = consumer(cluster, group, topic, recorder, "c1")
        flow = Flow(Producer(nameservers=cluster.nameservers), topic)
        sender = None
        try:
            await push.start()
            sender = asyncio.create_task(flow.run())
            await wait_until_async(lambda: sum(cluster.committed(group, topic).values()) >= 100, 10,
                                   "offsets to be committed")
            await asyncio.sleep(0.3)  # commits in flight land (they are synchronous in Redis)
            before = cluster.committed(group, topic)

            await asyncio.to_thread(private_redis.stop, sig)
            down = time.monotonic()
            resp = cluster.broker.http.get(f"/v1/groups/{group}/offsets", params={"topic": topic})
            cluster.broker.error(resp, 503, "UNAVAILABLE")
            # sends and consumption go on meanwhile (the flow raises otherwise)
            await wait_until_async(lambda: flow.acked_since(down) > 50 and sum(
                e.at >= down for e in recorder.events) > 50, 20, "work while Redis is down")
            sent_while_down = flow.acked_since(down)
            consumed_while_down = sum(e.at >= down for e in recorder.events)
            await asyncio.to_thread(private_redis.start)  # same port, same data

            after = cluster.committed(group, topic)
            assert all(after[q] >= offset for q, offset in before.items()), (before, after)
            flow.stopped.set()
            await sender
            acked = set(flow.acked)
            await wait_until_async(lambda: acked <= recorder.bodies(), 10,
                                   "every acknowledged message to be consumed")
            await wait_until_async(
                lambda: cluster.committed(group, topic) == cluster.max_offsets(topic), 10,
                "commits to resume once Redis is back")
        finally:
            flow.stopped.set()
            if sender is not None:
                await asyncio.gather(sender, return_exceptions=True)
            await push.close()
            await flow.producer.close()

        assert sent_while_down > 50, f"only {sent_while_down} sends while Redis was down"
        assert consumed_while_down > 50, f"only {consumed_while_down} consumed meanwhile"
        assert recorder.bodies() == acked

        # a new member of the group starts from the committed offsets: nothing old again
        fresh = Recorder()
        async with Producer(nameservers=cluster.nameservers) as producer, \
                consumer(cluster, group, topic, fresh, "c2"):
            new = [f"new-{i}" for i in range(20)]
            await asyncio.gather(*(producer.send(b, topic=topic) for b in new))
            await wait_until_async(lambda: fresh.bodies() >= set(new), 10, "the new messages")
            # an old message pulled from before the committed offsets would be in by now (its
            # queue's pulls are in order); nothing more within half a second either
            await quiet_for_async(lambda: len(fresh.events), 0.5, "deliveries")
        assert sorted(e.body for e in fresh.events) == sorted(new)
