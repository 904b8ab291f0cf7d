"""The SDK against real processes: produce, push-consume (plain, tag-filtered, broadcasting,
ordered) and the simple consumer, with routes from a real nameserver."""

from __future__ import annotations

import asyncio
import base64
import random
import re
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from tidemq import (
    ConsumeResult,
    InvalidReceiptHandleError,
    Message,
    Producer,
    PushConsumer,
    ReceivedMessage,
    SimpleConsumer,
)

from tests.support.clock import now_ms
from tests.support.procs import RedisServer
from tests.support.wait import wait_until_async
from tests.system.sdk_harness import FAST_CONSUMER, Recorder, SdkCluster, run_cluster, unique

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory,
            redis_server: RedisServer) -> Iterator[SdkCluster]:
    with run_cluster(tmp_path_factory.mktemp("sdk"), redis_server.url) as handle:
        yield handle


async def test_producer_round_trip_in_both_encodings(cluster: SdkCluster) -> None:
    topic = cluster.create_topic(queues=4)
    binary = bytes(range(256))  # not UTF-8: base64 in JSON, raw bytes in msgpack
    async with Producer(nameservers=cluster.nameservers) as producer:
        plain = await producer.send("hello", topic=topic, tag="A", keys=["order-1"],
                                    properties={"origin": "test"})
        raw = await producer.send(Message(binary, topic=topic, tag="B", message_id="my-id-1"))
        again = await producer.send(Message(b"ignored", topic=topic, message_id="my-id-1"))
        batch = await producer.send_batch(topic, [b"b0", Message("b1", tag="A"), "b2"])
        await producer.send_oneway("oneway", topic=topic, tag="A")
        # concurrent sends are coalesced into requests; each caller gets its own result
        many = await asyncio.gather(*(producer.send(f"m{i}", topic=topic) for i in range(40)))
    # close() delivered the oneway message

    sent = [plain, raw, *batch, *many]
    assert re.fullmatch(r"[0-9a-f]{32}", plain.message_id)
    assert raw.message_id == "my-id-1"
    assert again == raw, "a resend with the same message_id must be acknowledged, not stored"
    assert len({r.message_id for r in sent}) == len(sent)
    assert len({(r.queue_id, r.queue_offset) for r in sent}) == len(sent)
    assert {r.topic for r in sent} == {topic}
    assert sum(cluster.max_offsets(topic).values()) == len(sent) + 1  # + the oneway message
    # one more message sent in JSON through the REST API, read back by the SDK in msgpack
    cluster.broker.send(topic, {"message_id": "json-1", "body_encoding": "base64", "tag": "J",
                                "body": base64.b64encode(b"\xff\x00json").decode()})

    # push consumer: msgpack pulls
    recorder: dict[str, ReceivedMessage] = {}

    async def handle(message: ReceivedMessage) -> ConsumeResult:
        recorder[message.message_id] = message
        return ConsumeResult.SUCCESS

    async with PushConsumer(unique("G"), handler=handle, nameservers=cluster.nameservers,
                            subscriptions={topic: "*"}, **FAST_CONSUMER):
        await wait_until_async(lambda: len(recorder) == len(sent) + 2, 10, "every message consumed")
    for result in sent:
        got = recorder[result.message_id]
        assert (got.topic, got.queue_id, got.queue_offset) == (
            topic, result.queue_id, result.queue_offset)
    assert recorder[raw.message_id].body == binary
    first = recorder[plain.message_id]
    assert (first.text, first.tag, first.keys) == ("hello", "A", ["order-1"])
    assert first.properties.get("origin") == "test"
    assert [recorder[r.message_id].text for r in batch] == ["b0", "b1", "b2"]
    assert [recorder[r.message_id].text for r in many] == [f"m{i}" for i in range(40)]
    assert {m.body for m in recorder.values()} >= {b"oneway"}
    assert (recorder["json-1"].body, recorder["json-1"].tag) == (b"\xff\x00json", "J")

    # REST JSON pulls see the same messages; a non-UTF-8 body comes back as base64
    by_id = {m["message_id"]: m for q in range(4) for m in cluster.pull_all(topic, q)}
    assert set(by_id) == set(recorder)
    assert by_id[raw.message_id]["body_encoding"] == "base64"
    assert base64.b64decode(by_id[raw.message_id]["body"]) == binary
    assert by_id[plain.message_id]["body"] == "hello"
    looked_up = cluster.broker.http.get(f"/v1/messages/{plain.message_id}").json()
    assert looked_up["body"] == "hello" and looked_up["state"] == "stored"


async def test_delays_given_as_float_timedelta_and_datetime(cluster: SdkCluster) -> None:
    """Issue 34 item 3: a whole-float ``delay_ms`` (it failed with ``UnfitBatch``), a
    ``timedelta`` and ``datetime`` due times (aware, and naive = local time) reach the broker as
    the same milliseconds; the nameservers given as one comma-separated string."""
    topic = cluster.create_topic(queues=2)
    aware = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=250_000)
    naive = (datetime.now() + timedelta(hours=3)).replace(microsecond=0)
    async with Producer(nameservers=", ".join(cluster.nameservers)) as producer:
        before = now_ms()
        by_float = await producer.send(b"f", topic=topic, delay_ms=30 * 60 * 1000.0)
        by_delta = await producer.send(b"d", topic=topic, delay_ms=timedelta(minutes=5))
        after = now_ms()
        at_aware = await producer.send(Message(b"a", topic=topic, deliver_at_ms=aware))
        [at_naive] = await producer.send_batch(topic, [Message(b"n", deliver_at_ms=naive)])
    assert all(r.scheduled for r in (by_float, by_delta, at_aware, at_naive))
    assert by_float.deliver_at_ms is not None and by_delta.deliver_at_ms is not None
    assert before + 1_800_000 <= by_float.deliver_at_ms <= after + 1_800_000
    assert before + 300_000 <= by_delta.deliver_at_ms <= after + 300_000
    assert at_aware.deliver_at_ms == int(aware.timestamp() * 1000)
    assert at_naive.deliver_at_ms == int(naive.timestamp() * 1000)
    assert sum(cluster.max_offsets(topic).values()) == 0  # all still waiting


async def test_sharding_key_pins_one_queue(cluster: SdkCluster) -> None:
    topic = cluster.create_topic(queues=8)
    keys = [f"user-{k}" for k in range(6)]
    async with Producer(nameservers=cluster.nameservers) as producer:
        order = [key for _ in range(10) for key in keys]
        results = await asyncio.gather(*(
            producer.send(f"{key}:{i}", topic=topic, sharding_key=key)
            for i, key in enumerate(order)))
        batch = await producer.send_batch(
            topic, [Message(f"batch-{key}", sharding_key=key) for key in keys])
    queue_of: dict[str, set[int]] = defaultdict(set)
    for key, result in zip(order, results, strict=True):
        queue_of[key].add(result.queue_id)
    assert all(len(queues) == 1 for queues in queue_of.values()), queue_of
    for key, result in zip(keys, batch, strict=True):
        assert {result.queue_id} == queue_of[key]
    assert len({q for queues in queue_of.values() for q in queues}) > 1, \
        "six keys all hashed to one of eight queues: the key is not used"


async def test_tag_filter_and_broadcasting(cluster: SdkCluster) -> None:
    topic = cluster.create_topic(queues=4)
    group = unique("G")
    every, tagged = Recorder(), Recorder()
    consumers = [
        PushConsumer(group, handler=every.handler("b1"), nameservers=cluster.nameservers,
                     mode="broadcasting", subscriptions={topic: "*"}, **FAST_CONSUMER),
        PushConsumer(group, handler=every.handler("b2"), nameservers=cluster.nameservers,
                     mode="broadcasting", subscriptions={topic: "*"}, **FAST_CONSUMER),
        PushConsumer(unique("G"), handler=tagged.handler("t"), nameservers=cluster.nameservers,
                     subscriptions={topic: "A || C"}, **FAST_CONSUMER),
    ]
    for consumer in consumers:
        await consumer.start()
    try:
        await wait_until_async(lambda: all(len(c.assignment) == 4 for c in consumers), 10,
                               "every consumer owns every queue")
        tags = ["A", "B", "C", None]
        async with Producer(nameservers=cluster.nameservers) as producer:
            await asyncio.gather(*(producer.send(f"{i}", topic=topic, tag=tags[i % 4])
                                   for i in range(80)))
        await wait_until_async(lambda: len(every.events) >= 160 and len(tagged.events) >= 40, 10,
                               "both broadcasting consumers and the tag filter got their messages")
        await asyncio.sleep(0.3)  # a duplicate would show up now
    finally:
        for consumer in consumers:
            await consumer.close()
    for name in ("b1", "b2"):
        got = sorted(int(e.body) for e in every.events if e.consumer == name)
        assert got == list(range(80)), f"{name} did not get every message exactly once"
    assert sorted(int(e.body) for e in tagged.events) == [i for i in range(80) if i % 4 in (0, 2)]


async def test_orderly_consumption_per_sharding_key(cluster: SdkCluster) -> None:
    topic = cluster.create_topic(queues=4)
    keys = [f"k{k}" for k in range(8)]
    per_key = 30
    seen: dict[str, list[int]] = defaultdict(list)
    running: dict[int, int] = defaultdict(int)  # queue id → handlers running now
    peak = {"queue": 0, "total": 0}
    failed: set[str] = set()
    rng = random.Random(7)

    async def handle(message: ReceivedMessage) -> ConsumeResult:
        running[message.queue_id] += 1
        peak["queue"] = max(peak["queue"], running[message.queue_id])
        peak["total"] = max(peak["total"], sum(running.values()))
        try:
            await asyncio.sleep(rng.uniform(0, 0.004))
            if message.text not in failed and rng.random() < 0.05:
                failed.add(message.text)  # fails once: retried in place, order kept
                return ConsumeResult.RETRY_LATER
            key, seq = message.text.split(":")
            seen[key].append(int(seq))
            return ConsumeResult.SUCCESS
        finally:
            running[message.queue_id] -= 1

    async def send_key(producer: Producer, key: str) -> None:
        for seq in range(per_key):  # one after another: the send order of this key
            await producer.send(f"{key}:{seq}", topic=topic, sharding_key=key)

    async with Producer(nameservers=cluster.nameservers) as producer:
        await asyncio.gather(*(send_key(producer, key) for key in keys))
    async with PushConsumer(unique("G"), handler=handle, nameservers=cluster.nameservers,
                            subscriptions={topic: "*"}, orderly=True, max_concurrency=8,
                            pull_batch=8, **FAST_CONSUMER):
        await wait_until_async(lambda: sum(map(len, seen.values())) >= len(keys) * per_key, 20,
                               "every ordered message consumed")
    for key in keys:
        assert seen[key] == list(range(per_key)), f"{key} consumed out of order: {seen[key]}"
    assert peak["queue"] == 1, "an ordered queue ran two handlers at once"
    assert failed, "no handler failure was injected"
    assert peak["total"] > 1, "queues were not consumed concurrently"


async def test_simple_consumer_receive_invisibility_ack(cluster: SdkCluster) -> None:
    topic = cluster.create_topic(queues=2)
    async with Producer(nameservers=cluster.nameservers) as producer:
        sent = await producer.send_batch(topic, [f"s{i}" for i in range(6)])
    ids = {r.message_id for r in sent}
    async with SimpleConsumer(unique("G"), topic=topic, nameservers=cluster.nameservers,
                              invisible_ms=800) as consumer:
        got: list[ReceivedMessage] = []
        while len(got) < 6:
            batch = await consumer.receive(max=16, wait_ms=1000)
            assert batch, "receive returned nothing while messages were visible"
            got.extend(batch)
        assert {m.message_id for m in got} == ids
        assert all(m.receipt_handle and m.reconsume_times == 0 for m in got)

        acked, extended, dropped = got[:3], got[3], got[4:]
        assert await consumer.ack(acked) == 3
        old_handle = extended.receipt_handle
        assert old_handle is not None
        new_handle = await consumer.change_invisible_duration(extended, 30_000)
        assert new_handle != old_handle and extended.receipt_handle == new_handle
        with pytest.raises(InvalidReceiptHandleError):
            await consumer.change_invisible_duration(old_handle, 1000)

        # the two un-acked messages come back after their invisibility; nothing else does
        started = time.monotonic()
        back: list[ReceivedMessage] = []
        while len(back) < 2 and time.monotonic() - started < 10:
            back.extend(await consumer.receive(max=16, wait_ms=2000))
        assert sorted(m.message_id for m in back) == sorted(m.message_id for m in dropped)
        assert all(m.reconsume_times == 1 for m in back)
        assert time.monotonic() - started > 0.3, "came back before their invisibility ended"
        stale = [m.receipt_handle for m in dropped if m.receipt_handle]
        assert await consumer.ack(stale) == 0, "a superseded receipt handle was accepted"
        assert await consumer.ack(back) == 2

        # shorten the extended one: it comes back, is acked, and then nothing is left
        await consumer.change_invisible_duration(extended, 100)
        last = await consumer.receive(max=16, wait_ms=3000)
        assert [m.message_id for m in last] == [extended.message_id]
        assert await consumer.ack(last) == 1
        assert await consumer.receive(max=16, wait_ms=1200) == []
