from __future__ import annotations

import asyncio
import itertools
import zlib
from typing import Any

import pytest
from tidemq import (
    BadRequestError,
    ClientClosedError,
    InvalidDelayError,
    Message,
    MessageTooLargeError,
    Producer,
    RetryPolicy,
    TopicNotFoundError,
    UnsupportedMediaTypeError,
)
from tidemq.protocol.records.v2 import CONTENT_BATCH

from tests.sdk.fakes import Canned, FakeCluster

FAST = RetryPolicy(initial_backoff_s=0.001, max_backoff_s=0.01, max_retry_after_s=0.01)


def _producer(cluster: FakeCluster, **kw: Any) -> Producer:
    return Producer(broker_url=cluster.broker_url, transport=cluster.transport, retry=FAST,
                    **kw)


def _sent_ids(cluster: FakeCluster) -> list[list[str]]:
    return [[m["message_id"] for m in r.body["messages"]]
            for r in cluster.requests_to("/v1/topics/orders/messages")]


async def test_concurrent_sends_are_coalesced_and_each_caller_gets_its_own_result(
    cluster: FakeCluster,
) -> None:
    async with _producer(cluster, linger_ms=5) as producer:
        results = await asyncio.gather(*(
            producer.send(f"body-{i}", topic="orders", tag="t") for i in range(100)))
    requests = cluster.requests_to("/v1/topics/orders/messages")
    assert 1 <= len(requests) <= 2
    assert all(r.content_type == CONTENT_BATCH for r in requests)  # record format v2
    stored = cluster.broker.queues["orders"]
    last_offset: dict[int, int] = {}
    for i, result in enumerate(results):
        message = stored[result.queue_id][result.queue_offset]
        assert message["body"] == f"body-{i}".encode()  # the caller's own message
        assert message["message_id"] == result.message_id
        assert result.topic == "orders"
        assert result.queue_offset > last_offset.get(result.queue_id, -1)  # request order
        last_offset[result.queue_id] = result.queue_offset
    assert len({r.message_id for r in results}) == 100


async def test_sends_are_record_batches_only(cluster: FakeCluster) -> None:
    """No fallback to another form (issue 30): brokers of this repository take record batches,
    so a 415 is an error of its own, raised at once (not retriable) and nothing else is sent."""
    cluster.batches_refused = True
    async with _producer(cluster) as producer:
        with pytest.raises(UnsupportedMediaTypeError):
            await producer.send(b"one", topic="orders")
    kinds = [r.content_type for r in cluster.requests_to("/v1/topics/orders/messages")]
    assert kinds == [CONTENT_BATCH]
    assert cluster.broker.all_messages("orders") == []


async def test_max_batch_bounds_a_request(cluster: FakeCluster) -> None:
    async with _producer(cluster, linger_ms=50, max_batch=10) as producer:
        await asyncio.gather(*(producer.send(b"x", topic="orders") for i in range(35)))
    sizes = [len(ids) for ids in _sent_ids(cluster)]
    assert sizes == [10, 10, 10, 5]


async def test_every_message_has_an_id_that_stays_the_same_across_a_retry(
    cluster: FakeCluster,
) -> None:
    cluster.fail_next("/v1/topics/orders/messages",
                      Canned(503, "BROKER_BUSY", "flow control", {"Retry-After": "1"}))
    async with _producer(cluster) as producer:
        result = await producer.send(b"hello", topic="orders")
    first, second = _sent_ids(cluster)
    assert first == second == [result.message_id]
    assert 0 < len(result.message_id) <= 64


async def test_a_lost_answer_is_retried_and_stored_once(cluster: FakeCluster) -> None:
    cluster.lose_answer_next("/v1/topics/orders/messages")
    async with _producer(cluster) as producer:
        result = await producer.send(Message(b"once", keys=["k"]), topic="orders")
    assert len(_sent_ids(cluster)) == 2
    assert [m["message_id"] for m in cluster.broker.all_messages("orders")] == [result.message_id]


async def test_user_message_id_is_kept(cluster: FakeCluster) -> None:
    async with _producer(cluster) as producer:
        result = await producer.send(Message(b"x", topic="orders", message_id="order-42-created"))
    assert result.message_id == "order-42-created"


async def test_a_body_with_an_id_and_properties_is_sent_as_given_and_checked(
    cluster: FakeCluster,
) -> None:
    """``send(body, topic=, message_id=, properties=)`` (what tidemq.otel sends) builds no
    Message, and is checked as one would be."""
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with _producer(cluster) as producer:
        result = await producer.send(b"x", topic="orders", message_id="order-7",
                                     properties={"traceparent": traceparent})
        with pytest.raises(BadRequestError, match="message_id"):
            await producer.send(b"x", topic="orders", message_id="m" * 65)
        with pytest.raises(MessageTooLargeError, match="properties"):
            await producer.send(b"x", topic="orders", properties={"p": "v" * 40_000})
    assert result.message_id == "order-7"
    assert _sent_ids(cluster) == [["order-7"]]
    (sent,) = cluster.requests_to("/v1/topics/orders/messages")[0].body["messages"]
    assert sent["properties"] == {"traceparent": traceparent}


async def test_non_retriable_error_is_raised_with_code_and_message(cluster: FakeCluster) -> None:
    async with _producer(cluster) as producer:
        with pytest.raises(TopicNotFoundError) as info:
            await producer.send(b"x", topic="nope")
    assert info.value.status == 404 and "nope" in info.value.message


async def test_bad_message_fails_only_its_own_caller_in_a_coalesced_batch(
    cluster: FakeCluster,
) -> None:
    async with _producer(cluster, linger_ms=20) as producer:
        outcomes = await asyncio.gather(
            producer.send(b"fine", topic="orders"),
            producer.send(b"bad", topic="orders", properties={"TAGS": "reserved"}),
            return_exceptions=True)
    good, bad = outcomes
    assert isinstance(bad, BadRequestError)
    assert not isinstance(good, BaseException)
    # a reserved property name is refused by the SDK itself, before it joins a request
    assert [len(ids) for ids in _sent_ids(cluster)] == [1]
    assert len(cluster.broker.all_messages("orders")) == 1


async def test_invalid_arguments_fail_before_any_request(cluster: FakeCluster) -> None:
    async with _producer(cluster) as producer:
        with pytest.raises(InvalidDelayError):
            await producer.send(b"x", topic="orders", delay_level=99)
        with pytest.raises(InvalidDelayError):
            await producer.send(b"x", topic="orders", delay_level=2, delay_ms=5)
        with pytest.raises(MessageTooLargeError):
            await producer.send(b"x" * (4 * 1024 * 1024 + 1), topic="orders")
    assert cluster.requests_to("/v1/topics/orders/messages") == []


async def test_sharding_key_maps_to_one_stable_queue(cluster: FakeCluster) -> None:
    async with _producer(cluster) as producer:
        results = [await producer.send(b"x", topic="orders", sharding_key="user-7")
                   for _ in range(10)]
        other = await producer.send(b"x", topic="orders", sharding_key="user-8")
    expected = zlib.crc32(b"user-7") % 4
    assert {r.queue_id for r in results} == {expected}
    assert other.queue_id == zlib.crc32(b"user-8") % 4
    sent = [m for ids in cluster.requests_to("/v1/topics/orders/messages")
            for m in ids.body["messages"]]
    # the key alone: the broker hashes it (a queue_id beside it would be ambiguous: 400)
    assert sent[0]["sharding_key"] == "user-7" and "queue_id" not in sent[0]


async def test_round_robin_spreads_sends_over_every_queue(cluster: FakeCluster) -> None:
    async with _producer(cluster) as producer:
        queues = [(await producer.send(b"x", topic="orders")).queue_id for _ in range(8)]
    assert sorted(queues) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all((b - a) % 4 == 1 for a, b in itertools.pairwise(queues))


async def test_explicit_queue_id(cluster: FakeCluster) -> None:
    async with _producer(cluster) as producer:
        assert (await producer.send(b"x", topic="orders", queue_id=2)).queue_id == 2


async def test_nameserver_routes_spread_over_brokers_and_skip_a_dead_nameserver(
    two_brokers: FakeCluster,
) -> None:
    two_brokers.down.add(two_brokers.nameservers[0])
    async with Producer(nameservers=two_brokers.nameservers, transport=two_brokers.transport,
                        retry=FAST) as producer:
        for _ in range(8):
            await producer.send(b"x", topic="orders")
    per_broker = [len(b.all_messages("orders")) for b in two_brokers.iter_brokers()]
    assert per_broker == [4, 4]
    assert len(two_brokers.requests_to("/v1/routes/orders")) <= 3


async def test_send_batch_is_one_request_in_request_order(cluster: FakeCluster) -> None:
    async with _producer(cluster) as producer:
        results = await producer.send_batch(
            "orders", [b"a", "b", Message(b"c", tag="T", sharding_key="k")])
    assert len(cluster.requests_to("/v1/topics/orders/messages")) == 1
    stored = cluster.broker.queues["orders"]
    assert [stored[r.queue_id][r.queue_offset]["body"] for r in results] == [b"a", b"b", b"c"]
    assert results[2].queue_id == zlib.crc32(b"k") % 4


async def test_send_oneway_is_flushed_on_close_and_failures_only_logged(
    cluster: FakeCluster, caplog: pytest.LogCaptureFixture,
) -> None:
    producer = _producer(cluster, linger_ms=1000)
    await producer.send_oneway(b"fire", topic="orders")
    await producer.close()
    assert [m["body"] for m in cluster.broker.all_messages("orders")] == [b"fire"]

    producer = _producer(cluster)
    cluster.fail_next("/v1/topics/orders/messages", Canned(413, "MESSAGE_TOO_LARGE", "big"))
    await producer.send_oneway(b"doomed", topic="orders")
    await producer.close()
    assert "oneway send failed" in caplog.text


async def test_closed_producer_refuses_sends(cluster: FakeCluster) -> None:
    producer = _producer(cluster)
    await producer.close()
    with pytest.raises(ClientClosedError):
        await producer.send(b"x", topic="orders")


async def test_route_lookups_are_shared_between_concurrent_sends(cluster: FakeCluster) -> None:
    async with _producer(cluster) as producer:
        await asyncio.gather(*(producer.send(b"x", topic="orders") for _ in range(50)))
    assert len(cluster.requests_to("/v1/topics/orders", "GET")) == 1
