"""Two broker groups sharing one Redis and one cluster name keep their consumer state apart:
offsets, the group listing, receive cursors and in-flight messages are per broker."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from tests.broker.consumers.test_simple import FakeStore
from tests.support.procs import RedisServer
from tidemq_server.broker.consumers.offsets import OffsetStore
from tidemq_server.broker.consumers.simple import SimpleConsumerService
from tidemq_server.broker.messaging.longpoll import PullHold
from tidemq_server.common.constants import consumer_offsets_key, inflight_key, receive_cursor_key

pytestmark = pytest.mark.integration


@pytest.fixture
async def pair(redis_server: RedisServer) -> AsyncIterator[tuple[OffsetStore, OffsetStore]]:
    cluster = f"test-{uuid.uuid4().hex[:8]}"
    stores = (OffsetStore(redis_server.url, cluster, "broker-a"),
              OffsetStore(redis_server.url, cluster, "broker-b"))
    for store in stores:
        await store.start()
    yield stores
    for store in stores:
        await store.close()


async def test_offsets_of_the_same_group_topic_and_queue_do_not_collide(
    pair: tuple[OffsetStore, OffsetStore], redis_server: RedisServer,
) -> None:
    a, b = pair
    await a.commit("G", [("T", 0, 5), ("T", 1, 7)])
    await b.commit("G", [("T", 0, 50)])
    await b.commit("H", [("U", 2, 1)])
    assert await a.get("G", "T") == {0: 5, 1: 7}
    assert await b.get("G", "T") == {0: 50}
    assert await a.groups() == {"G": ["T"]}
    assert await b.groups() == {"G": ["T"], "H": ["U"]}
    await a.reset("G", "T", {0: 1})
    await a.delete_group("G")
    assert await a.get("G", "T") == {} and await b.get("G", "T") == {0: 50}
    client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        raw = await client.hgetall(consumer_offsets_key(b.cluster, "broker-b", "G", "T"))
    finally:
        await client.aclose()
    assert raw == {"0": "50"}


async def test_simple_consumer_state_is_per_broker(
    pair: tuple[OffsetStore, OffsetStore], redis_server: RedisServer,
) -> None:
    services = []
    for offsets in pair:
        store = FakeStore()
        for i in range(3):
            store.append("T", 0, f"{offsets.broker_name}-{i}")
        services.append(SimpleConsumerService(store, redis_server.url, offsets.cluster,
                                              PullHold(), offsets))
    a, b = services
    try:
        got_a = await a.receive("G", "T", [0], max_count=2, wait_ms=0)
        got_b = await b.receive("G", "T", [0], max_count=3, wait_ms=0)
        assert [r.record.body for r in got_a] == [b"broker-a-0", b"broker-a-1"]
        assert [r.record.body for r in got_b] == [b"broker-b-0", b"broker-b-1", b"broker-b-2"]
        assert await b.ack("G", [r.receipt_handle for r in got_b]) == 3
        assert await a.inflight_count("G", "T") == 2 and await b.inflight_count("G", "T") == 0
        client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
        try:
            cluster = pair[0].cluster
            assert await client.hgetall(receive_cursor_key(cluster, "broker-a", "G", "T")) == {
                "0": "2"}
            assert await client.hgetall(receive_cursor_key(cluster, "broker-b", "G", "T")) == {
                "0": "3"}
            assert await client.hlen(inflight_key(cluster, "broker-a", "G", "T")) == 2
            assert await client.hlen(inflight_key(cluster, "broker-b", "G", "T")) == 0
        finally:
            await client.aclose()
        assert await pair[1].get("G", "T") == {0: 3} and await pair[0].get("G", "T") == {}
    finally:
        for service in services:
            await service.close()
