"""The in-memory ``TestBroker`` beyond the shared behaviour suite (tests/sdk/test_behaviour.py):
its clock, check-back timing, retries and the DLQ, cancel by topic, the pytest fixture, and
that it needs nothing but the SDK."""

from __future__ import annotations

import subprocess
import sys
from functools import partial
from typing import Any

import orjson
from tidemq import (
    Message,
    PushConsumer,
    ReceivedMessage,
    TransactionState,
)
from tidemq.protocol import CONSUME_FAILURE, CONTENT_JSON, CONTENT_MSGPACK, decode_payload
from tidemq.testing.memory import TestBroker

from tests.support.wait import wait_until_async


async def _rest(broker: TestBroker, method: str, path: str, body: Any = None,
                accept: str = CONTENT_JSON, **params: Any) -> tuple[int, Any]:
    answer = await broker.transport.request(
        method, broker.broker_url + path,
        headers={"content-type": CONTENT_JSON, "accept": accept},
        content=None if body is None else orjson.dumps(body), params=params, timeout_s=5.0)
    return answer.status, decode_payload(answer.content, answer.headers["content-type"])


class Unknown:
    """Every local transaction is undecided; checks answer ``on_check``."""

    def __init__(self, on_check: TransactionState) -> None:
        self.on_check = on_check
        self.checked: list[ReceivedMessage] = []

    async def execute_local_transaction(self, message: Message, arg: Any) -> TransactionState:
        return TransactionState.UNKNOWN

    async def check_local_transaction(self, message: ReceivedMessage) -> TransactionState:
        self.checked.append(message)
        return self.on_check


async def test_delays_wait_for_the_clock_exactly(tidemq_test_broker: TestBroker) -> None:
    broker = tidemq_test_broker
    topic = broker.create_topic()
    at = broker.clock.now_ms + 3_600_000
    async with broker.producer() as producer:
        level = await producer.send(b"level 3", topic=topic, delay_level=3)  # 10 s
        timer = await producer.send(b"in an hour", topic=topic, deliver_at_ms=at)
    broker.advance(9.999)
    assert broker.messages(topic) == []
    broker.advance(0.001)
    assert [m.message_id for m in broker.messages(topic)] == [level.message_id]
    status, scheduled = await _rest(broker, "GET", "/v1/scheduled", topic=topic)
    assert status == 200
    assert (scheduled["pending"], scheduled["next_due_ms"], scheduled["timers"]) == (1, at, 1)
    broker.advance(3600)
    assert timer.message_id in {m.message_id for m in broker.messages(topic)}
    delivered = await broker.wait_for_message(topic, message_id=timer.message_id)
    assert delivered.store_timestamp_ms >= at


async def test_a_check_comes_only_after_the_immunity(tidemq_test_broker: TestBroker) -> None:
    broker = tidemq_test_broker
    topic = broker.create_topic()
    listener = Unknown(TransactionState.ROLLBACK)
    async with broker.transaction_producer("shop", listener) as producer:
        sent = await producer.send(b"undecided", topic=topic, check_immunity_s=30)
        broker.advance(29.9)
        _, pending = await _rest(broker, "GET", "/v1/transactions",
                                      producer_group="shop")
        assert [t["check_times"] for t in pending["transactions"]] == [0]
        broker.advance(0.1)
        await wait_until_async(lambda: listener.checked, timeout=5.0, what="the check")
        await wait_until_async(lambda: not broker.transactions.pending("shop"), timeout=5.0,
                               what="the rollback")
    assert listener.checked[0].message_id == sent.message_id
    assert broker.messages(topic) == []  # rolled back by its check: never delivered
    _, answer = await _rest(broker, "GET", f"/v1/messages/{sent.message_id}")
    assert answer["state"] == "rolled_back"


async def test_ending_a_transaction_twice(tidemq_test_broker: TestBroker) -> None:
    broker = tidemq_test_broker
    topic = broker.create_topic()
    status, half = await _rest(broker, "POST", "/v1/transactions", {
        "producer_group": "p", "topic": topic, "message": {"message_id": "m1", "body": "x"}})
    assert status == 200
    txid = half["transaction_id"]
    end = f"/v1/transactions/{txid}/end"
    assert await _rest(broker, "POST", end, {"producer_group": "p", "action": "commit"}) \
        == (200, {"state": "committed"})
    assert await _rest(broker, "POST", end, {"producer_group": "p", "action": "commit"}) \
        == (200, {"state": "committed"})
    status, answer = await _rest(broker, "POST", end, {"producer_group": "p",
                                                       "action": "rollback"})
    assert (status, answer["code"]) == (409, "TRANSACTION_ALREADY_ENDED")
    status, answer = await _rest(broker, "POST", "/v1/transactions/nope/end",
                                 {"producer_group": "p", "action": "commit"})
    assert (status, answer["code"]) == (404, "TRANSACTION_NOT_FOUND")
    status, again = await _rest(broker, "POST", "/v1/transactions", {
        "producer_group": "p", "topic": topic, "message": {"message_id": "m1", "body": "x"}})
    assert again["transaction_id"] == txid  # a resent half keeps its transaction
    assert len(broker.messages(topic)) == 1


async def test_failures_go_to_the_retry_topic_then_the_dlq() -> None:
    async with TestBroker(max_reconsume_times=2) as broker:
        topic = broker.create_topic()
        seen: list[int] = []

        async def fail(message: ReceivedMessage) -> None:
            seen.append(message.reconsume_times)
            raise RuntimeError("cannot bill this")

        async with broker.producer() as producer:
            sent = await producer.send(b"poison", topic=topic)
        consumer: PushConsumer = broker.consumer("billing", fail, {topic: "*"})
        async with consumer:
            await wait_until_async(lambda: seen == [0], timeout=5.0, what="the first try")
            for retries in (1, 2):
                await wait_until_async(partial(_handed_back, broker, "billing", retries),
                                       timeout=5.0, what="the hand-back")
                broker.advance(3600)  # the back-off (level 3 + retries) is over
                await wait_until_async(partial(_tries, seen, retries + 1), timeout=5.0,
                                       what=f"retry {retries}")
            await wait_until_async(lambda: broker.store.topics.get("%DLQ%billing")
                                   and broker.messages("%DLQ%billing"), timeout=5.0,
                                   what="the dead letter")
        assert seen == [0, 1, 2]
        dead = broker.messages("%DLQ%billing")[0]
        assert (dead.message_id, dead.reconsume_times, dead.origin_topic) == (
            sent.message_id, 3, topic)
        assert "cannot bill this" in dead.properties[CONSUME_FAILURE]


def _handed_back(broker: TestBroker, group: str, times: int) -> bool:
    """The ``times``-th hand-back of a message waits out its back-off."""
    return broker.store.pending_delays(f"%RETRY%{group}")["pending"] == 1 and \
        len(broker.messages(f"%RETRY%{group}")) == times - 1


def _tries(seen: list[int], n: int) -> bool:
    return len(seen) == n


async def test_cancel_by_topic_when_one_id_is_delayed_twice() -> None:
    async with TestBroker() as broker:
        a, b = broker.create_topic("A"), broker.create_topic("B")
        body = {"messages": [{"message_id": "twice", "body": "x", "delay_ms": 1000}]}
        for topic in (a, b):
            assert (await _rest(broker, "POST", f"/v1/topics/{topic}/messages", body))[0] == 200
        status, answer = await _rest(broker, "DELETE", "/v1/messages/twice/schedule")
        assert (status, answer["code"]) == (409, "AMBIGUOUS_MESSAGE_ID")
        status, answer = await _rest(broker, "DELETE", "/v1/messages/twice/schedule", topic=a)
        assert (status, answer) == (200, {"message_id": "twice", "state": "cancelled"})
        broker.advance(1)
        assert broker.messages(a) == [] and len(broker.messages(b)) == 1
        status, answer = await _rest(broker, "DELETE", "/v1/messages/twice/schedule", topic=b)
        assert (status, answer["code"]) == (409, "ALREADY_DELIVERED")


async def test_answers_follow_the_accepted_content_type() -> None:
    async with TestBroker() as broker:
        topic = broker.create_topic(queues=1)
        raw = b"\xff\x00binary"
        async with broker.producer() as producer:
            await producer.send(raw, topic=topic)
        path = f"/v1/topics/{topic}/queues/0/messages"
        _, as_json = await _rest(broker, "GET", path, offset=0)
        assert as_json["messages"][0]["body_encoding"] == "base64"
        _, as_msgpack = await _rest(broker, "GET", path, accept=CONTENT_MSGPACK, offset=0)
        assert as_msgpack["messages"][0]["body"] == raw
        status, answer = await _rest(broker, "GET", "/v1/no/such/path")
        assert (status, answer) == (404, {"detail": "Not Found"})


def test_it_needs_nothing_but_the_sdk() -> None:
    """Importing the test broker (and the plugin package) loads neither the services nor the
    process-starting part."""
    code = ("import sys, tidemq.testing, tidemq.testing.memory; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('services', 'redis', 'fastapi', 'pyspark', 'uvicorn') "
            "or m in ('tidemq.testing._system', 'tidemq.testing._processes')); "
            "print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
