from __future__ import annotations

from typing import Any

import pytest
from tidemq import ConfigurationError, InvalidReceiptHandleError, SimpleConsumer

from tests.sdk.fakes import FakeCluster


def _consumer(cluster: FakeCluster, **kw: Any) -> SimpleConsumer:
    return SimpleConsumer("audit", topic="orders", broker_url=cluster.broker_url,
                          transport=cluster.transport, **kw)


async def test_receive_request_shape_and_result(cluster: FakeCluster) -> None:
    cluster.broker.put("orders", 0, b"\x00binary", tag="a")
    cluster.broker.put("orders", 1, b"text", tag="a")
    async with _consumer(cluster, tag_expression="a || b", invisible_ms=5000) as consumer:
        messages = await consumer.receive(max=8, wait_ms=100)
    assert [m.body for m in messages] == [b"\x00binary", b"text"]
    assert all(m.receipt_handle for m in messages)
    (request,) = cluster.requests_to("/v1/groups/audit/receive")
    assert request.method == "POST" and request.content_type == "application/msgpack"
    assert request.body == {"topic": "orders", "tags": "a || b", "max": 8,
                            "invisible_ms": 5000, "wait_ms": 100}


async def test_ack_accepts_messages_and_handles(cluster: FakeCluster) -> None:
    for i in range(3):
        cluster.broker.put("orders", 0, f"{i}".encode())
    async with _consumer(cluster) as consumer:
        first, second, third = await consumer.receive(invisible_ms=1000, wait_ms=0)
        assert await consumer.ack(first) == 1
        assert await consumer.ack([second, third.receipt_handle or ""]) == 2
    acks = cluster.requests_to("/v1/groups/audit/ack")
    assert [r.body for r in acks] == [
        {"receipt_handles": [first.receipt_handle]},
        {"receipt_handles": [second.receipt_handle, third.receipt_handle]}]
    assert cluster.requests_to("/v1/groups/audit/receive")[0].body["invisible_ms"] == 1000


async def test_change_invisible_duration_updates_the_handle(cluster: FakeCluster) -> None:
    cluster.broker.put("orders", 0, b"slow job")
    async with _consumer(cluster) as consumer:
        (message,) = await consumer.receive()
        old = message.receipt_handle
        new = await consumer.change_invisible_duration(message, 60_000)
        assert message.receipt_handle == new != old
        (request,) = cluster.requests_to("/v1/groups/audit/invisibility")
        assert request.body == {"receipt_handle": old, "invisible_ms": 60_000}
        with pytest.raises(InvalidReceiptHandleError):
            await consumer.change_invisible_duration(old or "", 1000)
        assert await consumer.ack(message) == 1


async def test_tag_collisions_are_filtered_and_acked(cluster: FakeCluster) -> None:
    cluster.broker.put("orders", 0, b"mine", tag="a")
    cluster.broker.put("orders", 0, b"foreign", tag="zzz")
    async with _consumer(cluster, tag_expression="a") as consumer:
        messages = await consumer.receive()
    assert [m.body for m in messages] == [b"mine"]
    assert len(cluster.broker.acked) == 1


async def test_several_brokers_are_asked_without_waiting_first(two_brokers: FakeCluster) -> None:
    b1 = list(two_brokers.iter_brokers())[1]
    b1.put("orders", 3, b"on broker 1")
    consumer = SimpleConsumer("audit", topic="orders", nameservers=two_brokers.nameservers,
                              transport=two_brokers.transport)
    async with consumer:
        messages = await consumer.receive(wait_ms=1000)
        assert [m.body for m in messages] == [b"on broker 1"]
        assert await consumer.ack(messages) == 1
    assert two_brokers.requests_to("/v1/groups/audit/ack")[0].host == b1.address
    waits = [r.body["wait_ms"] for r in two_brokers.requests_to("/v1/groups/audit/receive")]
    assert waits[0] == 0


async def test_invalid_arguments(cluster: FakeCluster) -> None:
    with pytest.raises(ConfigurationError):
        _consumer(cluster, invisible_ms=0)
    async with _consumer(cluster) as consumer:
        with pytest.raises(ConfigurationError):
            await consumer.receive(max=0)
