"""The SDK over a cluster of real processes: two broker groups (broker-a, broker-b) registered
with two nameservers, sharing one Redis.

- sends spread over both groups; a push consumer group of two members consumes everything once,
  with offsets kept per (group, topic, broker, queue) side by side in the shared Redis;
- ordered messages (sharding key) stay ordered; a simple consumer receives from both groups;
- broker-b SIGKILLed while an application sends continuously: no send fails, every acknowledged
  message is consumed once broker-b is back (same data dir); duplicates are counted;
- one nameserver SIGKILLed while sending: nothing fails, new clients start with the dead one
  first in their list.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from tidemq import ConsumeResult, Producer, PushConsumer, ReceivedMessage, SimpleConsumer

from tests.support.procs import RedisServer
from tests.support.wait import quiet_for_async, wait_until, wait_until_async
from tests.system.cluster_harness import (
    EXPIRY_S,
    ROUTE_REFRESH_S,
    SdkGroups,
    Sender,
    duplicates,
    run_sdk_groups,
    summary,
)
from tests.system.sdk_harness import FAST_CONSUMER, Recorder, repeated, unique
from tidemq_server.common.constants import consumer_offsets_key

pytestmark = pytest.mark.integration

CLIENT: dict[str, Any] = {"route_refresh_s": ROUTE_REFRESH_S}
CONSUMER: dict[str, Any] = {**FAST_CONSUMER, **CLIENT}


@pytest.fixture
def groups(tmp_path: Path, redis_server: RedisServer) -> Iterator[SdkGroups]:
    with run_sdk_groups(tmp_path, redis_server.url) as running:
        yield running


def push(groups: SdkGroups, group: str, topic: str, recorder: Recorder, name: str,
         **kw: Any) -> PushConsumer:
    consumer = PushConsumer(group, handler=recorder.handler(name), nameservers=groups.ns_urls,
                            client_id=f"{name}-{unique('c')}", **{**CONSUMER, **kw})
    consumer.subscribe(topic)
    return consumer


async def test_sends_spread_and_a_group_of_two_consumes_everything_once(
    groups: SdkGroups, redis_server: RedisServer,
) -> None:
    topic = groups.create_topic(queues=4)
    group = unique("G")
    recorder = Recorder()
    first, second = (push(groups, group, topic, recorder, n) for n in ("c1", "c2"))
    async with first, second:
        await wait_until_async(lambda: len(first.assignment) == len(second.assignment) == 4, 15,
                               "the two members to share the eight queues")
        assert {q.broker_name for q in first.assignment + second.assignment} == {
            "broker-a", "broker-b"}
        assert len(set(first.assignment) | set(second.assignment)) == 8
        async with Producer(nameservers=groups.ns_urls, **CLIENT) as producer:
            await asyncio.gather(*(producer.send(f"m{i}", topic=topic) for i in range(400)))
        sent = {f"m{i}" for i in range(400)}
        await wait_until_async(lambda: recorder.bodies() >= sent, 20, "every message consumed")
        # a second delivery would show up within half a second (both poll without pause)
        await quiet_for_async(lambda: len(recorder.events), 0.5, "deliveries")
        await first.commit_offsets()
        await second.commit_offsets()

    stored = groups.stored(topic)
    assert sorted(stored["broker-a"] + stored["broker-b"]) == sorted(sent)  # each stored once
    assert min(len(stored["broker-a"]), len(stored["broker-b"])) >= 150, {
        k: len(v) for k, v in stored.items()}
    assert repeated(recorder.events) == [], "a message was consumed twice"
    assert {e.consumer for e in recorder.events} == {"c1", "c2"}
    # offsets are per broker: each group's committed offsets are exactly its own queue ends,
    # in keys of their own in the one Redis both brokers use
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        for name in ("broker-a", "broker-b"):
            committed = groups.committed(name, group, topic)
            assert committed == groups.max_offsets(name, topic), name
            raw = client.hgetall(consumer_offsets_key(groups.cluster, name, group, topic))
            assert {int(q): int(o) for q, o in raw.items()} == committed
    finally:
        client.close()
    listed = groups.http.get(f"{groups.url('broker-b')}/v1/groups").json()["groups"]
    assert [g["topics"] for g in listed if g["group"] == group] == [[topic]]


async def test_ordered_messages_by_sharding_key_stay_ordered(groups: SdkGroups) -> None:
    topic = groups.create_topic(queues=4)
    keys = [f"k{k}" for k in range(12)]
    per_key = 25
    seen: dict[str, list[int]] = defaultdict(list)

    async def handle(message: ReceivedMessage) -> ConsumeResult:
        key, seq = message.text.split(":")
        seen[key].append(int(seq))
        return ConsumeResult.SUCCESS

    async def send_key(producer: Producer, key: str) -> set[int]:
        queues = set()
        for seq in range(per_key):  # one after another: the send order of this key
            result = await producer.send(f"{key}:{seq}", topic=topic, sharding_key=key)
            queues.add(result.queue_id)
        return queues

    async with Producer(nameservers=groups.ns_urls, **CLIENT) as producer:
        placed = await asyncio.gather(*(send_key(producer, key) for key in keys))
    assert all(len(q) == 1 for q in placed), "a key was spread over several queues"
    stored = groups.stored(topic)
    assert all(stored[name] for name in ("broker-a", "broker-b")), "keys all on one group"
    consumer = PushConsumer(unique("G"), handler=handle, nameservers=groups.ns_urls,
                            subscriptions={topic: "*"}, orderly=True, **CONSUMER)
    async with consumer:
        await wait_until_async(lambda: sum(map(len, seen.values())) >= len(keys) * per_key, 20,
                               "every ordered message consumed")
    for key in keys:
        assert seen[key] == list(range(per_key)), f"{key} consumed out of order: {seen[key]}"


async def test_a_simple_consumer_receives_from_every_group(groups: SdkGroups) -> None:
    topic = groups.create_topic(queues=2)
    async with Producer(nameservers=groups.ns_urls, **CLIENT) as producer:
        await asyncio.gather(*(producer.send(f"s{i}", topic=topic) for i in range(60)))
    stored = groups.stored(topic)
    assert stored["broker-a"] and stored["broker-b"]
    got: list[str] = []
    async with SimpleConsumer(unique("G"), topic=topic, nameservers=groups.ns_urls,
                              **CLIENT) as consumer:
        while len(got) < 60:
            batch = await consumer.receive(max=16, wait_ms=2000)
            assert batch, f"receive came back empty with {60 - len(got)} messages left"
            assert await consumer.ack(batch) == len(batch)
            got += [m.text for m in batch]
        assert await consumer.receive(max=16, wait_ms=300) == []
    assert sorted(got) == sorted(f"s{i}" for i in range(60))


async def test_sigkill_of_a_group_while_sending_fails_no_send_and_loses_nothing(
    groups: SdkGroups, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="tidemq")
    topic = groups.create_topic(queues=4)
    group = unique("G")
    recorder = Recorder()
    consumer = push(groups, group, topic, recorder, "c1")
    producer = Producer(nameservers=groups.ns_urls, **CLIENT)
    sender = Sender(producer, topic)
    task = None
    try:
        await consumer.start()
        task = asyncio.create_task(sender.run())
        await wait_until_async(lambda: len(recorder.events) >= 200, 15, "consumption to start")

        await asyncio.to_thread(groups.kill_broker, "broker-b")
        killed = time.monotonic()
        before_kill = len(sender.acked)
        # past the nameservers' expiry (EXPIRY_S) b leaves the routes; sends go on meanwhile
        await asyncio.to_thread(groups.wait_route, topic, {"broker-a": 4}, EXPIRY_S + 15)
        await wait_until_async(lambda: len(sender.acked) - before_kill >= 100, 20,
                               "sends while broker-b is down")
        during = len(sender.acked) - before_kill
        await asyncio.to_thread(groups.start_broker, "broker-b")
        restarted = time.monotonic()
        held = sum(groups.max_offsets("broker-b", topic).values())
        # the producer finds broker-b in its next route and probes it once its back-off ends
        await wait_until_async(lambda: sum(groups.max_offsets("broker-b", topic).values()) > held,
                               20, "sends to reach broker-b again", every=0.2)
        back_s = time.monotonic() - restarted
        more = len(sender.acked) + 50
        await wait_until_async(lambda: len(sender.acked) >= more, 20, "sends with both back")
        sender.stop.set()
        await task
        acked = set(sender.acked)
        await wait_until_async(lambda: acked <= recorder.bodies(), 30,
                               "every acknowledged message to be consumed")
        stored = groups.stored(topic)
    finally:
        sender.stop.set()
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
        await consumer.close()
        await producer.close()

    all_stored = stored["broker-a"] + stored["broker-b"]
    figures = dict(acked=len(acked), sent_while_down=during, app_errors=len(sender.errors),
                   lost=len(acked - set(all_stored)),
                   stored_duplicates=duplicates(all_stored),
                   sdk_possible_duplicates=producer.possible_duplicates,
                   failovers=producer.failovers,
                   consumed_duplicates=len(repeated(recorder.events)),
                   down_s=round(restarted - killed, 1), back_on_b_s=round(back_s, 1))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    print(summary(**figures, client_warnings=len(warnings)))
    print("\n".join(warnings))
    assert len(warnings) <= 12, warnings  # once per client and broker, not per request
    assert sender.errors == [], sender.errors[:5]
    assert figures["lost"] == 0
    assert during >= 100, f"only {during} sends while broker-b was down"
    assert figures["stored_duplicates"] <= producer.possible_duplicates, figures
    assert recorder.bodies() == acked


def route_lookups(groups: SdkGroups, metrics_url: str) -> float:
    """Route lookups a nameserver answered with a route (its metric)."""
    text = groups.http.get(metrics_url).text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("tidemq_nameserver_route_lookups_total{")
               and 'result="found"' in line)


async def test_a_nameserver_killed_while_sending_fails_nothing(groups: SdkGroups) -> None:
    topic = groups.create_topic(queues=4)
    group = unique("G")
    recorder = Recorder()
    consumer = push(groups, group, topic, recorder, "c1")
    producer = Producer(nameservers=groups.ns_urls, **CLIENT)
    sender = Sender(producer, topic)
    task = None
    try:
        await consumer.start()
        task = asyncio.create_task(sender.run())
        await wait_until_async(lambda: len(recorder.events) >= 100, 15, "consumption to start")
        lookups = groups.nameservers[1].url + "/metrics"
        served = route_lookups(groups, lookups)
        await asyncio.to_thread(groups.kill_nameserver, 0)
        killed = len(sender.acked)
        # several route refreshes with ns 0 dead: three of each client (producer and consumer,
        # one every ROUTE_REFRESH_S) answered by ns 1
        await asyncio.to_thread(wait_until, lambda: route_lookups(groups, lookups) >= served + 6,
                                10 * ROUTE_REFRESH_S + 10, "route refreshes through ns 1")
        # a client started now has the dead nameserver first in its list
        async with Producer(nameservers=groups.ns_urls, **CLIENT) as late:
            started = time.monotonic()
            fresh = await asyncio.gather(*(late.send(f"late-{i}", topic=topic)
                                           for i in range(20)))
            first_send_s = time.monotonic() - started
        sender.stop.set()
        await task
        acked = set(sender.acked) | {f"late-{i}" for i in range(20)}
        await wait_until_async(lambda: acked <= recorder.bodies(), 20, "every message consumed")
    finally:
        sender.stop.set()
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
        await consumer.close()
        await producer.close()

    stored = groups.stored(topic)
    all_stored = stored["broker-a"] + stored["broker-b"]
    print(summary(acked=len(acked), after_kill=len(sender.acked) - killed,
                  app_errors=len(sender.errors), stored_duplicates=duplicates(all_stored),
                  consumed_duplicates=len(repeated(recorder.events)),
                  new_client_first_send_s=round(first_send_s, 2)))
    assert sender.errors == []
    assert len(sender.acked) - killed >= 100
    assert len(fresh) == 20  # the dead nameserver first in its list failed none of them
    assert duplicates(all_stored) == 0
    assert sorted(all_stored) == sorted(acked)
