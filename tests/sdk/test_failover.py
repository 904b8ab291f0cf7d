"""The SDK over two broker groups when one of them fails (in-memory brokers behind
httpx.MockTransport): sends fail over and keep their message id, a failed group is avoided and
probed again, a lost answer is retried on the same group first, ordered sends keep their queue,
transaction ends go to the group holding the half, consumers keep serving the live group."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx
import pytest
from tidemq import (
    ConsumeResult,
    Message,
    Producer,
    PushConsumer,
    ReceivedMessage,
    RetryPolicy,
    SimpleConsumer,
    TransactionProducer,
    TransactionState,
    TransportError,
)
from tidemq._client import Client
from tidemq._fault import BrokerHealth

from tests.sdk.fakes import Canned, FakeCluster
from tests.support.clock import FakeClock
from tests.support.wait import quiet_for_async, wait_until_async

# a short deadline: the cases that give up do so in a second (the stick window is half of it)
FAST = RetryPolicy(initial_backoff_s=0.001, max_backoff_s=0.01, max_retry_after_s=0.01,
                   deadline_s=1.0)
TOPIC = "orders"


def producer(c: FakeCluster, **kw: Any) -> Producer:
    return Producer(nameservers=c.nameservers, transport=c.transport, retry=FAST, **kw)


def hand_clock(p: Client) -> FakeClock:
    """Give a client's broker health a clock the test moves (back-off of 1 s, then 2 s...)."""
    clock = FakeClock(now=0.0)
    p._health = BrokerHealth(initial_s=1.0, max_s=8.0, probe_timeout_s=5.0, clock=clock)
    return clock


def sends_to(c: FakeCluster, address: str) -> list[str]:
    return [m["message_id"] for r in c.requests_to(f"/v1/topics/{TOPIC}/messages")
            if r.host == address for m in r.body["messages"]]


async def test_sends_fail_over_keep_their_id_and_avoid_the_dead_group_until_probed(
    two_brokers: FakeCluster,
) -> None:
    a, b = two_brokers.iter_brokers()
    two_brokers.down.add(b.address)
    async with producer(two_brokers) as p:
        clock = hand_clock(p)
        results = await asyncio.gather(*(p.send(f"m{i}", topic=TOPIC) for i in range(40)))
        assert len(a.all_messages(TOPIC)) == 40 and b.all_messages(TOPIC) == []
        tried_on_b = sends_to(two_brokers, b.address)
        assert tried_on_b and set(tried_on_b) <= {r.message_id for r in results}
        assert set(tried_on_b) <= set(sends_to(two_brokers, a.address))  # same ids moved on
        assert p.failovers == len(set(tried_on_b)) and p.possible_duplicates == 0

        for i in range(20):  # b backs off: nothing goes there
            await p.send(f"later{i}", topic=TOPIC)
        assert sends_to(two_brokers, b.address) == tried_on_b

        two_brokers.down.discard(b.address)  # b is back; after its back-off one send probes it
        clock.now += 1.0
        for i in range(20):
            await p.send(f"back{i}", topic=TOPIC)
    assert 8 <= len(b.all_messages(TOPIC)) <= 12  # the probe succeeded: round robin again


async def test_busy_group_is_left_for_the_other_and_nothing_is_stored_twice(
    two_brokers: FakeCluster,
) -> None:
    a, b = two_brokers.iter_brokers()
    two_brokers.fail_next(f"/v1/topics/{TOPIC}/messages",
                          *[Canned(503, "BROKER_BUSY", "flow control")] * 2)
    async with producer(two_brokers) as p:
        hand_clock(p)
        results = await asyncio.gather(*(p.send(f"m{i}", topic=TOPIC) for i in range(8)))
    stored = [m["message_id"] for m in a.all_messages(TOPIC) + b.all_messages(TOPIC)]
    assert sorted(stored) == sorted(r.message_id for r in results)


async def test_a_lost_answer_is_retried_on_the_same_group_and_stored_once(
    two_brokers: FakeCluster,
) -> None:
    two_brokers.lose_answer_next(f"/v1/topics/{TOPIC}/messages")
    async with producer(two_brokers) as p:
        result = await p.send(b"once", topic=TOPIC)
        assert p.failovers == 0 and p.possible_duplicates == 0
    requests = two_brokers.requests_to(f"/v1/topics/{TOPIC}/messages")
    assert len(requests) == 2 and requests[0].host == requests[1].host
    copies = [m for broker in two_brokers.iter_brokers() for m in broker.all_messages(TOPIC)]
    assert [m["message_id"] for m in copies] == [result.message_id]


async def test_a_group_lost_after_storing_gives_a_counted_second_copy(
    two_brokers: FakeCluster,
) -> None:
    a, b = two_brokers.iter_brokers()
    serve = two_brokers.transport.handle_async_request

    async def dies_after_storing(request: httpx.Request) -> httpx.Response:
        response = await serve(request)
        if request.url.host == "broker1" and request.url.path.endswith("/messages"):
            two_brokers.down.add(b.address)  # SIGKILL right after the write
            raise httpx.ReadError("connection reset", request=request)
        return response

    p = Producer(nameservers=two_brokers.nameservers, retry=FAST,
                 transport=httpx.MockTransport(dies_after_storing))
    async with p:
        hand_clock(p)
        # the producer starts at a random queue: send until one lands on the dying broker
        results = []
        for i in range(64):
            results.append(await p.send(f"m{i}", topic=TOPIC))
            if p.failovers:
                break
        assert p.possible_duplicates == 1 and p.failovers == 1
    (copied,) = [m["message_id"] for m in b.all_messages(TOPIC)]
    assert copied in {m["message_id"] for m in a.all_messages(TOPIC)}
    assert {r.message_id for r in results} == {m["message_id"] for m in a.all_messages(TOPIC)}


async def test_ordered_sends_keep_their_queue_and_fail_unless_allowed_to_move(
    two_brokers: FakeCluster,
) -> None:
    a, b = two_brokers.iter_brokers()
    async with producer(two_brokers) as p:
        keys = {(await p.send(b"x", topic=TOPIC, sharding_key=f"k{i}")).queue_id: f"k{i}"
                for i in range(30)}
        key_on_b = next(f"k{i}" for i in range(30)
                        if any(m.get("sharding_key") == f"k{i}" for m in
                               (x["wire"] for x in b.all_messages(TOPIC))))
        assert keys
        two_brokers.down.add(b.address)
        with pytest.raises(TransportError):
            await p.send(b"stays", topic=TOPIC, sharding_key=key_on_b)
    assert not any(m["body"] == b"stays" for m in a.all_messages(TOPIC))
    async with producer(two_brokers, ordered_failover=True) as p:
        moved = await p.send(b"moves", topic=TOPIC, sharding_key=key_on_b)
    assert any(m["message_id"] == moved.message_id for m in a.all_messages(TOPIC))


class Listener:
    async def execute_local_transaction(self, message: Message, arg: Any) -> TransactionState:
        return TransactionState.COMMIT

    async def check_local_transaction(self, message: ReceivedMessage) -> TransactionState:
        return TransactionState.COMMIT


async def test_halves_fail_over_and_each_end_goes_to_the_group_holding_its_half(
    two_brokers: FakeCluster,
) -> None:
    a, b = two_brokers.iter_brokers()
    two_brokers.down.add(b.address)
    tx = TransactionProducer("tx-group", Listener(), nameservers=two_brokers.nameservers,
                             transport=two_brokers.transport, retry=FAST, check_wait_ms=50,
                             heartbeat_interval_s=0.05)
    async with tx:
        clock = hand_clock(tx)
        first = await asyncio.gather(*(tx.send(f"t{i}", topic=TOPIC) for i in range(6)))
        assert {r.broker for r in first} == {a.address}
        two_brokers.down.discard(b.address)
        clock.now += 1.0
        second = [await tx.send(f"u{i}", topic=TOPIC) for i in range(6)]
    assert {r.broker for r in second} == {a.address, b.address}
    for broker in (a, b):
        ended = {e["transaction_id"] for e in broker.ends}
        assert ended == set(broker.halves), broker.name  # every end where its half is
    assert len(a.halves) + len(b.halves) == 12


async def test_push_consumer_serves_the_live_group_while_the_other_is_down_quietly(
    two_brokers: FakeCluster, caplog: pytest.LogCaptureFixture,
) -> None:
    a, b = two_brokers.iter_brokers()
    for broker in (a, b):
        for q in range(4):
            broker.put(TOPIC, q, f"{broker.name}-{q}".encode())
    two_brokers.down.add(b.address)
    seen: list[str] = []

    async def handle(message: ReceivedMessage) -> ConsumeResult:
        seen.append(message.text)
        return ConsumeResult.SUCCESS

    consumer = PushConsumer("g", handler=handle, nameservers=two_brokers.nameservers,
                            transport=two_brokers.transport, retry=FAST, pull_wait_ms=20,
                            heartbeat_interval_s=0.05, offset_commit_interval_s=0.05)
    consumer.subscribe(TOPIC)
    caplog.set_level(logging.INFO, logger="tidemq")
    async with consumer:
        started = time.monotonic()
        await wait_until_async(lambda: len(seen) == 4, what="broker-0's four messages")
        # b's wait: the assignment stays on broker-0 until a second has passed since the
        # start, the window of "< 40 tries"
        await quiet_for_async(lambda: {q.broker_name for q in consumer.assignment},
                              max(0.0, started + 1.0 - time.monotonic()),
                              "the assignment while broker-1 is down")
        assert {q.broker_name for q in consumer.assignment} == {"broker-0"}
        assert sorted(seen) == sorted(f"broker-0-{q}" for q in range(4))
        tries = len([r for r in two_brokers.requests if r.host == b.address])
        two_brokers.down.discard(b.address)
        for _ in range(200):
            if len(seen) == 8:
                break
            await asyncio.sleep(0.02)
        assert len(consumer.assignment) == 8  # every queue of both groups
    assert sorted(seen) == sorted(f"{n}-{q}" for n in ("broker-0", "broker-1") for q in range(4))
    assert tries < 40, f"{tries} requests to the dead broker in a second: no back-off"
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING
            and b.address in r.getMessage()]
    assert 1 <= len(loud) <= 3, [r.getMessage() for r in loud]
    assert any("reachable again" in r.getMessage() or "is back" in r.getMessage()
               for r in caplog.records)
    assert a.offsets[("g", TOPIC, 0)] == 1 and b.offsets[("g", TOPIC, 0)] == 1


async def test_simple_consumer_receives_from_the_live_group_and_raises_when_all_are_down(
    two_brokers: FakeCluster,
) -> None:
    a, b = two_brokers.iter_brokers()
    a.put(TOPIC, 0, b"on a")
    b.put(TOPIC, 1, b"on b")
    two_brokers.down.add(b.address)
    consumer = SimpleConsumer("s", topic=TOPIC, nameservers=two_brokers.nameservers,
                              transport=two_brokers.transport, retry=FAST)
    clock = hand_clock(consumer)
    async with consumer:
        got = [m.body for m in await consumer.receive(wait_ms=50)]
        got += [m.body for m in await consumer.receive(wait_ms=50)]
        assert got == [b"on a"]
        two_brokers.down.add(a.address)
        clock.advance(1.0)  # b's back-off (1 s) has passed: both are tried, both fail
        with pytest.raises(TransportError):
            await consumer.receive(wait_ms=50)
        two_brokers.down.clear()
        clock.advance(2.0)  # past both back-offs again (a's 1 s, b's second: 2 s)
        assert [m.body for m in await consumer.receive(wait_ms=50)] == [b"on b"]


async def test_a_dead_nameserver_is_passed_over_once_not_on_every_lookup(
    two_brokers: FakeCluster,
) -> None:
    dead = two_brokers.nameservers[0]
    two_brokers.down.add(dead)
    async with producer(two_brokers, route_refresh_s=0.01) as p:
        await p.send(b"x", topic=TOPIC)
        await asyncio.sleep(0.2)  # many background refreshes
        p._routes.invalidate(TOPIC)
        await p.send(b"y", topic=TOPIC)
    assert len([r for r in two_brokers.requests if r.host == dead]) == 1
    assert len(two_brokers.requests_to(f"/v1/routes/{TOPIC}")) > 5
