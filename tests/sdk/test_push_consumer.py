from __future__ import annotations

import asyncio
from typing import Any

import pytest
from tidemq import (
    ConfigurationError,
    ConsumeResult,
    PushConsumer,
    ReceivedMessage,
    RetryPolicy,
)

from tests.sdk.fakes import Canned, FakeCluster
from tests.support.wait import hang, wait_until_async

NO_RETRY = RetryPolicy(max_attempts=1)


def _consumer(cluster: FakeCluster, handler: Any, group: str = "g1", **kw: Any) -> PushConsumer:
    settings: dict[str, Any] = dict(
        broker_url=cluster.broker_url, transport=cluster.transport, pull_wait_ms=50,
        heartbeat_interval_s=60.0, offset_commit_interval_s=60.0, local_retry_pause_s=0.01,
        orderly_retry_pause_s=0.01, close_timeout_s=1.0)
    settings.update(kw)
    return PushConsumer(group, handler=handler, **settings)


def _fill(cluster: FakeCluster, per_queue: int, topic: str = "orders",
          tag: str | None = "a") -> None:
    for q in range(len(cluster.broker.queues[topic])):
        for i in range(per_queue):
            cluster.broker.put(topic, q, f"{q}-{i}".encode(), tag=tag)


async def test_messages_reach_the_handler_and_offsets_are_committed(cluster: FakeCluster) -> None:
    _fill(cluster, 5)
    received: list[ReceivedMessage] = []

    async def handler(message: ReceivedMessage) -> ConsumeResult:
        received.append(message)
        return ConsumeResult.SUCCESS

    consumer = _consumer(cluster, handler)
    consumer.subscribe("orders", "a || b")
    async with consumer:
        await wait_until_async(lambda: len(received) == 20)
        assert len(consumer.assignment) == 4
        await consumer.commit_offsets()
        assert cluster.broker.offsets == {("g1", "orders", q): 5 for q in range(4)}
    assert sorted(m.body for m in received) == sorted(
        f"{q}-{i}".encode() for q in range(4) for i in range(5))
    beat = cluster.broker.heartbeats[0]
    assert beat == {"client_id": consumer.client_id, "mode": "clustering",
                    "subscriptions": {"orders": "a || b", "%RETRY%g1": "*"}}
    polls = cluster.requests_to("/v1/pull", "POST")  # one long poll for all queues
    assert not cluster.requests_to("/v1/topics/orders/queues/")
    asked = {(q["topic"], q["queue_id"]): q["tags"] for q in polls[0].body["queues"]}
    assert asked == {("orders", q): "a || b" for q in range(4)}
    assert polls[0].body["group"] == "g1"
    assert cluster.requests_to(f"/v1/groups/g1/members/{consumer.client_id}", "DELETE")


async def test_consumption_resumes_at_the_committed_offset(cluster: FakeCluster) -> None:
    _fill(cluster, 5)
    for q in range(4):
        cluster.broker.offsets[("g1", "orders", q)] = 3
    received: list[bytes] = []

    async def handler(message: ReceivedMessage) -> None:
        received.append(message.body)

    async with _consumer(cluster, handler, subscriptions={"orders": "*"}):
        await wait_until_async(lambda: len(received) == 8)
        await asyncio.sleep(0.05)
    assert sorted(received) == sorted(f"{q}-{i}".encode() for q in range(4) for i in (3, 4))


async def test_consume_from_last_skips_the_backlog(cluster: FakeCluster) -> None:
    _fill(cluster, 5)
    received: list[bytes] = []

    async def handler(message: ReceivedMessage) -> None:
        received.append(message.body)

    async with _consumer(cluster, handler, subscriptions={"orders": "*"}, consume_from="last"):
        await asyncio.sleep(0.05)
        cluster.broker.put("orders", 2, b"new", tag="a")
        await wait_until_async(lambda: received == [b"new"])


async def test_retry_later_hands_the_message_to_the_retry_topic(cluster: FakeCluster) -> None:
    cluster.broker.put("orders", 0, b"flaky", tag="a", message_id="m-flaky")
    cluster.broker.put("orders", 0, b"fine", tag="a", message_id="m-fine")
    seen: list[tuple[str, str, int]] = []

    async def handler(message: ReceivedMessage) -> ConsumeResult:
        seen.append((message.message_id, message.topic, message.reconsume_times))
        if message.message_id == "m-flaky" and message.reconsume_times == 0:
            return ConsumeResult.RETRY_LATER
        return ConsumeResult.SUCCESS

    consumer = _consumer(cluster, handler, subscriptions={"orders": "*"})
    async with consumer:
        await wait_until_async(lambda: cluster.broker.retried == [("g1", "m-flaky")])
        await consumer.rebalance()  # the retry topic exists now: subscribe to it
        assert any(q.topic == "%RETRY%g1" for q in consumer.assignment)
        await wait_until_async(lambda: ("m-flaky", "orders", 1) in seen)
        await consumer.commit_offsets()
    assert cluster.broker.offsets[("g1", "orders", 0)] == 2
    assert cluster.broker.offsets[("g1", "%RETRY%g1", 0)] == 1


async def test_handler_exception_counts_as_retry_later(cluster: FakeCluster) -> None:
    cluster.broker.put("orders", 1, b"boom", tag="a", message_id="m-boom")

    async def handler(message: ReceivedMessage) -> ConsumeResult:
        raise RuntimeError("handler bug")

    async with _consumer(cluster, handler, subscriptions={"orders": "*"}):
        await wait_until_async(lambda: ("g1", "m-boom") in cluster.broker.retried)


async def test_failed_retry_call_keeps_the_message_and_consumes_it_again(
    cluster: FakeCluster,
) -> None:
    cluster.broker.put("orders", 0, b"x", tag="a", message_id="m-x")
    cluster.fail_next("/v1/groups/g1/retry", Canned(503, "UNAVAILABLE", "redis down"),
                      Canned(503, "UNAVAILABLE", "redis down"))
    calls = 0

    async def handler(message: ReceivedMessage) -> ConsumeResult:
        nonlocal calls
        calls += 1
        return ConsumeResult.RETRY_LATER

    consumer = _consumer(cluster, handler, subscriptions={"orders": "*"}, retry=NO_RETRY)
    async with consumer:
        await wait_until_async(lambda: calls >= 2)
        await consumer.commit_offsets()
        assert cluster.broker.offsets[("g1", "orders", 0)] == 0  # not lost: still in flight
        await wait_until_async(lambda: cluster.broker.retried == [("g1", "m-x")])
        await consumer.commit_offsets()
        assert cluster.broker.offsets[("g1", "orders", 0)] == 1
    assert calls == 3  # first try + one local reconsume per failed retry call


async def test_commit_waits_for_the_slowest_in_flight_message(cluster: FakeCluster) -> None:
    for i in range(5):
        cluster.broker.put("orders", 0, f"{i}".encode(), tag="a")
    gate = asyncio.Event()
    done: list[int] = []

    async def handler(message: ReceivedMessage) -> None:
        if message.queue_offset == 1:
            await gate.wait()
        done.append(message.queue_offset)

    consumer = _consumer(cluster, handler, subscriptions={"orders": "*"})
    async with consumer:
        await wait_until_async(lambda: sorted(done) == [0, 2, 3, 4])
        await consumer.commit_offsets()
        assert cluster.broker.offsets[("g1", "orders", 0)] == 1
        gate.set()
        await wait_until_async(lambda: len(done) == 5)
        await consumer.commit_offsets()
        assert cluster.broker.offsets[("g1", "orders", 0)] == 5


async def test_a_handler_past_its_timeout_is_cancelled_and_retried_while_others_go_on(
        cluster: FakeCluster) -> None:
    for i in range(6):
        cluster.broker.put("orders", 0, f"{i}".encode(), tag="a", message_id=f"m-{i}")
    cancelled: list[str] = []
    done: list[int] = []

    async def handler(message: ReceivedMessage) -> None:
        if message.message_id == "m-2" and message.reconsume_times == 0:
            try:
                await hang()
            except asyncio.CancelledError:
                cancelled.append(message.message_id)
                raise
        done.append(message.queue_offset)

    consumer = _consumer(cluster, handler, subscriptions={"orders": "*"},
                         consume_timeout_s=0.2, max_concurrency=2)
    async with consumer:
        await wait_until_async(lambda: sorted(done) == [0, 1, 3, 4, 5], 2.0)
        assert cancelled == []  # the stuck one still runs: its timeout has not come
        await wait_until_async(lambda: cluster.broker.retried == [("g1", "m-2")], 2.0)
        assert cancelled == ["m-2"]
        await consumer.commit_offsets()
        assert cluster.broker.offsets[("g1", "orders", 0)] == 6  # handed back: finished


async def test_at_most_max_concurrency_handlers_run_at_once(cluster: FakeCluster) -> None:
    _fill(cluster, 10)
    running = peak = 0
    done = 0

    async def handler(message: ReceivedMessage) -> None:
        nonlocal running, peak, done
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.002)
        running -= 1
        done += 1

    async with _consumer(cluster, handler, subscriptions={"orders": "*"}, max_concurrency=3):
        await wait_until_async(lambda: done == 40)
    assert peak == 3


async def test_close_cancels_a_stuck_handler_and_leaves_its_message_uncommitted(
        cluster: FakeCluster) -> None:
    for i in range(3):
        cluster.broker.put("orders", 0, f"{i}".encode(), tag="a")
    started = asyncio.Event()
    finished: list[int] = []

    async def handler(message: ReceivedMessage) -> None:
        if message.queue_offset == 1:
            started.set()
            await hang()
        finished.append(message.queue_offset)

    consumer = _consumer(cluster, handler, subscriptions={"orders": "*"}, close_timeout_s=0.2)
    await consumer.start()
    await asyncio.wait_for(started.wait(), 2.0)
    await wait_until_async(lambda: sorted(finished) == [0, 2])
    await asyncio.wait_for(consumer.close(), 2.0)
    assert cluster.broker.offsets[("g1", "orders", 0)] == 1  # the stuck one is read again


async def test_tags_are_confirmed_on_the_client(cluster: FakeCluster) -> None:
    cluster.broker.filter_tags = False
    for tag in ("a", "b", "a", None):
        cluster.broker.put("orders", 0, b"x", tag=tag)
    tags: list[str | None] = []

    async def handler(message: ReceivedMessage) -> None:
        tags.append(message.tag)

    consumer = _consumer(cluster, handler, subscriptions={"orders": "a"})
    async with consumer:
        await wait_until_async(lambda: len(tags) == 2)
        await asyncio.sleep(0.05)
        await consumer.commit_offsets()
    assert tags == ["a", "a"]
    assert cluster.broker.offsets[("g1", "orders", 0)] == 4


async def test_members_share_the_queues_and_rebalance_when_one_leaves(
    cluster: FakeCluster,
) -> None:
    async def handler(message: ReceivedMessage) -> None:
        return None

    a = _consumer(cluster, handler, subscriptions={"orders": "*"}, client_id="a")
    b = _consumer(cluster, handler, subscriptions={"orders": "*"}, client_id="b")
    await a.start()
    assert [q.queue_id for q in a.assignment] == [0, 1, 2, 3]
    await b.start()
    await a.rebalance()
    assert a.members == b.members == ["a", "b"]
    assert [q.queue_id for q in a.assignment] == [0, 1]
    assert [q.queue_id for q in b.assignment] == [2, 3]
    assert {("g1", "orders", 2), ("g1", "orders", 3)} <= set(cluster.broker.offsets)  # released
    await b.close()
    await a.rebalance()
    assert a.members == ["a"] and len(a.assignment) == 4
    await a.close()


async def test_orderly_mode_processes_a_queue_in_order_and_retries_in_place(
    cluster: FakeCluster,
) -> None:
    for i in range(6):
        cluster.broker.put("orders", 0, f"{i}".encode(), tag="a")
    calls: list[tuple[int, int]] = []
    running = 0
    overlap = False

    async def handler(message: ReceivedMessage) -> ConsumeResult:
        nonlocal running, overlap
        running += 1
        overlap = overlap or running > 1
        await asyncio.sleep(0.001)
        running -= 1
        calls.append((message.queue_offset, message.reconsume_times))
        if message.queue_offset == 2 and message.reconsume_times < 2:
            return ConsumeResult.RETRY_LATER
        return ConsumeResult.SUCCESS

    async with _consumer(cluster, handler, subscriptions={"orders": "*"}, orderly=True):
        await wait_until_async(lambda: len(calls) == 8)
    assert calls == [(0, 0), (1, 0), (2, 0), (2, 1), (2, 2), (3, 0), (4, 0), (5, 0)]
    assert not overlap and cluster.broker.retried == []


async def test_broadcasting_consumes_everything_everywhere_and_keeps_offsets_local(
    cluster: FakeCluster,
) -> None:
    _fill(cluster, 2)
    seen: dict[str, list[bytes]] = {"a": [], "b": []}

    def handler_for(name: str) -> Any:
        async def handler(message: ReceivedMessage) -> ConsumeResult:
            seen[name].append(message.body)
            return ConsumeResult.RETRY_LATER if message.body == b"0-0" else ConsumeResult.SUCCESS
        return handler

    consumers = [_consumer(cluster, handler_for(n), subscriptions={"orders": "*"}, client_id=n,
                           mode="broadcasting", max_reconsume_times=2) for n in ("a", "b")]
    for c in consumers:
        await c.start()
    await wait_until_async(lambda: all(len(v) == 9 for v in seen.values()))  # 8 + one local retry
    for c in consumers:
        assert len(c.assignment) == 4
        await c.close()
    assert cluster.broker.offsets == {} and cluster.broker.retried == []
    assert cluster.broker.heartbeats[0]["mode"] == "broadcasting"
    assert "%RETRY%g1" not in cluster.broker.heartbeats[0]["subscriptions"]


async def test_configuration_errors(cluster: FakeCluster) -> None:
    async def handler(message: ReceivedMessage) -> None:
        return None

    with pytest.raises(ConfigurationError):
        _consumer(cluster, handler, mode="fanout")
    with pytest.raises(ConfigurationError):
        await _consumer(cluster, handler).start()  # nothing subscribed


async def test_a_queue_behind_the_consumer_is_waited_for_not_skipped(
        cluster: FakeCluster) -> None:
    """A broker answers the consumer's offset out of range because it is behind (a replica
    that cut its log to copy damaged records again), then catches up before the consumer asks
    where the queue ends: the consumer keeps its offset and reads what the queue holds there,
    instead of jumping to the new end (the faults suite's push group skipped 154 that way)."""
    _fill(cluster, 5)
    received: list[ReceivedMessage] = []

    async def handler(message: ReceivedMessage) -> ConsumeResult:
        received.append(message)
        return ConsumeResult.SUCCESS

    broker = cluster.broker
    plain_topic = broker._topic

    def caught_up_by_now(topic: str) -> Any:  # the copy goes on while the consumer asks
        queue = broker.queues["orders"][0]
        while len(queue) < 9:
            broker.put("orders", 0, f"0-{len(queue)}".encode(), tag="a")
        return plain_topic(topic)

    consumer = _consumer(cluster, handler)
    consumer.subscribe("orders", "*")
    async with consumer:
        await wait_until_async(lambda: len(received) == 20)
        del broker.queues["orders"][0][2:]  # behind the consumer's offset 5 on queue 0
        broker._topic = caught_up_by_now  # type: ignore[method-assign]
        await wait_until_async(lambda: len(received) >= 24)
    again = sorted(m.queue_offset for m in received[20:] if m.queue_id == 0)
    assert again == [5, 6, 7, 8]  # nothing between the consumer's offset and the end skipped
