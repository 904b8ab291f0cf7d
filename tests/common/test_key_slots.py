"""Redis Cluster safety of every multi-key operation: the keys of one MULTI (or one pipeline)
hash to one slot (CRC16 mod 16384 of the key's hash tag), checked on the keys the code really
sends; then the same operations against a real one-node Redis Cluster, which answers CROSSSLOT to
anything else. Also: a broker renames the keys an older tidemq wrote without the hash tag."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from types import TracebackType
from typing import Any

import pytest
import redis as redis_sync

from tests.broker.consumers.test_simple import FakeStore
from tests.support.procs import RedisServer
from tests.support.sentinel import Node, start_cluster_node
from tidemq_server.broker.consumers.offsets import Command, OffsetStore
from tidemq_server.broker.consumers.simple import SimpleConsumerService
from tidemq_server.broker.messaging.longpoll import PullHold
from tidemq_server.checker.progress import ProgressStore
from tidemq_server.common.constants import (
    consumer_offsets_index_key,
    consumer_offsets_key,
    inflight_key,
    legacy_consumer_key_patterns,
    receive_cursor_key,
)
from tidemq_server.scheduler.progress import Progress

SLOTS = 16384
NOWHERE = "redis://127.0.0.1:1/0"  # a client that is never used to connect
# (cluster, broker) pairs, including names with the characters hash tags are made of
NAMES = [("DefaultCluster", "broker-a"), ("prod:eu", "b{1}"), ("c", "broker:b}")]
GROUPS = ["g1", "GID_orders", "g{weird}", "g:colon}"]
TOPICS = ["t", "orders{x}", "a:b"]


def crc16(data: bytes) -> int:
    """CRC16-CCITT (XMODEM), the checksum Redis Cluster hashes keys with."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def key_slot(key: str) -> int:
    """The Redis Cluster slot of a key: of its hash tag (first ``{...}``, non-empty) if any."""
    raw = key.encode()
    start = raw.find(b"{")
    if start != -1:
        end = raw.find(b"}", start + 1)
        if end > start + 1:
            raw = raw[start + 1:end]
    return crc16(raw) % SLOTS


def keys_of(command: Command) -> list[str]:
    """The keys of the commands the offset store sends (DEL takes several; EVAL names its
    key count)."""
    name = str(command[0]).upper()
    assert name in ("HSET", "SADD", "SREM", "DEL", "EVAL"), f"unexpected command {name}"
    if name == "EVAL":
        return [str(k) for k in command[3:3 + int(str(command[2]))]]
    return [str(k) for k in command[1:]] if name == "DEL" else [str(command[1])]


def test_slot_function_matches_the_cluster_specification() -> None:
    assert crc16(b"123456789") == 0x31C3  # the check value of the spec's CRC16
    assert key_slot("foo") == 12182
    assert key_slot("{user1000}.following") == key_slot("{user1000}.followers")
    assert key_slot("foo{}{bar}") == crc16(b"foo{}{bar}") % SLOTS  # empty tag: the whole key
    assert key_slot("foo{{bar}}zap") == crc16(b"{bar") % SLOTS
    assert key_slot("foo{bar}{zap}") == crc16(b"bar") % SLOTS


@pytest.mark.parametrize(("cluster", "broker"), NAMES)
async def test_one_offset_batch_is_one_slot(cluster: str, broker: str) -> None:
    """The writer sends every queued commit, reset and group delete in one MULTI."""
    store = OffsetStore(NOWHERE, cluster, broker)
    batch: list[Command] = []
    for group in GROUPS:
        batch += store.commit_commands(group, {t: {"0": 5, "3": 9} for t in TOPICS})
        batch += store.commit_commands(group, {t: {"0": 6} for t in TOPICS}, True)
        batch += store.reset_commands(group, TOPICS[0], {1: 2})
        batch += store.reset_commands(group, TOPICS[1], {})
        batch += store.delete_commands(group, TOPICS)
    keys = [k for command in batch for k in keys_of(command)]
    assert len(set(keys)) == len(GROUPS) * (len(TOPICS) + 1)
    assert {key_slot(k) for k in keys} == {key_slot(keys[0])}
    await store.close()


@pytest.mark.parametrize(("cluster", "broker"), NAMES)
def test_every_broker_consumer_key_shares_the_broker_slot(cluster: str, broker: str) -> None:
    keys = [f(cluster, broker, g, t) for g in GROUPS for t in TOPICS
            for f in (consumer_offsets_key, inflight_key, receive_cursor_key)]
    keys += [consumer_offsets_index_key(cluster, broker, g) for g in GROUPS]
    assert len({key_slot(k) for k in keys}) == 1


class RecordingPipeline:
    """Records the keys each pipeline touches (a fake of one redis-py object, for this module)."""

    def __init__(self, log: list[tuple[bool, list[str]]], transaction: bool) -> None:
        self.log, self.transaction = log, transaction
        self.keys: list[str] = []

    async def __aenter__(self) -> RecordingPipeline:
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None,
                        ) -> None:
        return None

    def _key(self, key: str, *_: Any, **__: Any) -> RecordingPipeline:
        self.keys.append(key)
        return self

    hset = hdel = hgetall = _key

    async def execute(self) -> list[Any]:
        self.log.append((self.transaction, list(self.keys)))
        return [{} for _ in self.keys]


class RecordingRedis:
    def __init__(self) -> None:
        self.log: list[tuple[bool, list[str]]] = []

    def pipeline(self, transaction: bool = True) -> RecordingPipeline:
        return RecordingPipeline(self.log, transaction)


@pytest.mark.parametrize(("cluster", "broker"), NAMES)
async def test_simple_consumer_pipelines_are_one_slot(cluster: str, broker: str) -> None:
    offsets = OffsetStore(NOWHERE, cluster, broker)
    client = RecordingRedis()
    svc = SimpleConsumerService(FakeStore(), client, cluster, PullHold(),  # type: ignore[arg-type]
                                offsets)
    for group in GROUPS:
        for topic in TOPICS:
            await svc._write(group, topic, {"0:1": "1:2:1"}, ["0:0"], {"0": 2})
            svc._states.pop((group, topic), None)
            offsets.get = _no_offsets  # type: ignore[method-assign]
            await svc._state(group, topic)
    assert len(client.log) == 2 * len(GROUPS) * len(TOPICS)
    assert any(transaction for transaction, _ in client.log)
    for _, keys in client.log:
        assert len(keys) >= 2 and len({key_slot(k) for k in keys}) == 1, keys
    await offsets.close()


async def _no_offsets(group: str, topic: str) -> dict[int, int]:
    return {}


async def test_scheduler_transaction_is_one_key() -> None:
    progress = Progress(NOWHERE, "c", "broker-a")
    await progress.redis.aclose()
    client = RecordingRedis()
    progress.redis = client  # type: ignore[assignment]
    await progress.end_level(3, 100)
    assert client.log == [(True, [progress.key, progress.key])]


# --- against a real one-node Redis Cluster ---------------------------------------------------


@pytest.fixture(scope="module")
def cluster_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    node = start_cluster_node(tmp_path_factory.mktemp("cluster"))
    yield node
    node.stop()


@pytest.fixture
async def cluster_offsets(cluster_node: Node) -> AsyncIterator[OffsetStore]:
    store = OffsetStore(f"redis://127.0.0.1:{cluster_node.port}/0", f"c-{uuid.uuid4().hex[:6]}",
                        "broker-a")
    await store.start()
    yield store
    await store.close()


@pytest.mark.integration
async def test_offsets_on_redis_cluster(cluster_offsets: OffsetStore) -> None:
    store = cluster_offsets
    await asyncio.gather(*(store.commit(g, [(t, q, 10 + q) for t in TOPICS for q in range(3)])
                           for g in GROUPS))  # concurrent: one batch, one MULTI, many groups
    assert await store.get_many(GROUPS[0], TOPICS) == [{0: 10, 1: 11, 2: 12}] * len(TOPICS)
    await asyncio.gather(store.reset(GROUPS[1], TOPICS[0], {0: 1}),
                         store.reset(GROUPS[1], TOPICS[1], {}), store.delete_group(GROUPS[2]))
    assert await store.get(GROUPS[1], TOPICS[0]) == {0: 1}
    assert await store.topics(GROUPS[1]) == sorted([TOPICS[0], TOPICS[2]])
    groups = await store.groups()
    assert sorted(groups) == sorted(g for g in GROUPS if g != GROUPS[2])


@pytest.mark.integration
async def test_simple_consumer_on_redis_cluster(cluster_node: Node,
                                                cluster_offsets: OffsetStore) -> None:
    store = FakeStore()
    hold = PullHold()
    store.add_listener(hold.notify)
    for i in range(6):
        store.append("t", i % 2, f"m{i}")
    url = f"redis://127.0.0.1:{cluster_node.port}/0"
    svc = SimpleConsumerService(store, url, cluster_offsets.cluster, hold, cluster_offsets)
    try:
        got = await svc.receive("g", "t", [0, 1], max_count=4, wait_ms=0)
        assert len(got) == 4
        handle = await svc.change_invisibility("g", got[0].receipt_handle, 10_000)
        assert await svc.ack("g", [handle, *(r.receipt_handle for r in got[1:])]) == 4
        assert await svc.inflight_count("g", "t") == 0
        assert await cluster_offsets.get("g", "t") == {0: 2, 1: 2}
    finally:
        await svc.close()


@pytest.mark.integration
async def test_checker_and_scheduler_progress_on_redis_cluster(cluster_node: Node) -> None:
    url = f"redis://127.0.0.1:{cluster_node.port}/0"
    progress = Progress(url, "c", "broker-a")
    checker = ProgressStore(url, "c")
    checker.bind("broker-a")
    try:
        await progress.set_intake(5)
        await progress.begin_level(2, 40)
        await progress.end_level(2, 40)
        await progress.add_cancel(2, 41, 123, "mid")
        assert await progress.load() == (5, {2: 40}, {})
        assert await progress.load_cancels() == {(2, 41): (123, "mid")}
        await checker.save(7, 8, 6)
        assert await checker.load() == (7, 8, 6)
    finally:
        await progress.close()
        await checker.close()


# --- keys of an older tidemq ------------------------------------------------------------------


def _legacy(cluster: str, broker: str, kind: str, rest: str) -> str:
    return f"tidemq:{cluster}:{broker}:{kind}:{rest}"


@pytest.mark.integration
async def test_legacy_keys_are_renamed_at_start(redis_server: RedisServer) -> None:
    cluster = f"c-{uuid.uuid4().hex[:6]}"
    with redis_sync.Redis(port=redis_server.port, decode_responses=True) as r:
        r.hset(_legacy(cluster, "broker-a", "offsets", "g:t"), mapping={"0": 7, "1": 9})
        r.sadd(_legacy(cluster, "broker-a", "offset-topics", "g"), "t")
        r.hset(_legacy(cluster, "broker-a", "receive-cursor", "g:t"), "0", 8)
        r.hset(_legacy(cluster, "broker-a", "inflight", "g:t"), "0:7", "1:2:1")
        r.hset(_legacy(cluster, "broker-b", "offsets", "g:t"), "0", 1)  # another broker's
        # newer state under the new name wins over the old one
        r.hset(_legacy(cluster, "broker-a", "offsets", "h:t"), "0", 1)
        r.hset(consumer_offsets_key(cluster, "broker-a", "h", "t"), "0", 2)
    store = OffsetStore(redis_server.url, cluster, "broker-a")
    await store.start()
    try:
        for _ in range(100):
            if store.migrated:
                break
            await asyncio.sleep(0.02)
        assert store.migrated == 4
        assert await store.get("g", "t") == {0: 7, 1: 9}
        assert await store.groups() == {"g": ["t"]}
        assert await store.get("h", "t") == {0: 2}
        with redis_sync.Redis(port=redis_server.port, decode_responses=True) as r:
            assert r.hgetall(receive_cursor_key(cluster, "broker-a", "g", "t")) == {"0": "8"}
            assert r.hgetall(inflight_key(cluster, "broker-a", "g", "t")) == {"0:7": "1:2:1"}
            left = sorted(r.scan_iter(match=f"tidemq:{cluster}:*"))
        assert left == [_legacy(cluster, "broker-a", "offsets", "h:t"),
                        _legacy(cluster, "broker-b", "offsets", "g:t")]
        assert len(legacy_consumer_key_patterns(cluster, "broker-a")) == 4
    finally:
        await store.close()
