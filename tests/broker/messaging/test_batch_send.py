"""Producer-made batches (application/x-tidemq-batch) through SendService over a real store:
appended as sent, refused whole with the record and field named, de-duplicated against the
same layers as a JSON send, delays routed per record."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tidemq.protocol import ErrorCode, Limits, Perm, ProtocolError
from tidemq.protocol.records.v2 import U32, BatchBuilder, DelayKind, seal
from tidemq.protocol.records.v2_read import validate

from tests.broker.store.conftest import small_config
from tidemq_server.broker.delays.routing import DELAY_LEVEL_TOPIC, DelayRouter
from tidemq_server.broker.ingest.dedup import DedupCache, Placed, RunPlaces
from tidemq_server.broker.ingest.writes import Ingest
from tidemq_server.broker.messaging.send import SendService
from tidemq_server.broker.messaging.topics import TopicManager
from tidemq_server.broker.observability import BrokerMetrics
from tidemq_server.broker.store import MessageStore
from tidemq_server.common.clock import now_ms

HOST = "10.1.2.3:4567"


@pytest.fixture
async def sent(tmp_path: Path) -> AsyncIterator[tuple[SendService, MessageStore]]:
    store = await MessageStore.open(small_config(tmp_path / "store"))
    topics = TopicManager(tmp_path)
    await topics.put("T", 4, Perm.READ_WRITE)
    limits = Limits(max_batch_messages=50)
    router = DelayRouter((1000, 5000), limits.max_delay_ms)
    ingest = Ingest(store, store.writer, DedupCache(600, 1000, 0), BrokerMetrics(),
                    router.waiting)
    svc = SendService(ingest, topics, limits, router)
    yield svc, store
    await store.close()


def batch(queue_id: int, ids: list[str], topic: str = "T", **extra: Any) -> bytes:
    b = BatchBuilder(topic, queue_id)
    for mid in ids:
        b.add(f"body of {mid}".encode(), mid, tag="Paid", keys=[f"order-{mid}"],
              properties={"region": "eu"}, born_timestamp=1234, **extra)
    return b.finish()


async def test_batches_are_appended_as_sent_and_answered_per_batch(sent: Any) -> None:
    svc, store = sent
    first, second = batch(0, ["a1", "a2"]), batch(2, ["b1"])
    answer = await svc.send_batches("T", first + second, HOST)
    assert answer == {"batches": [[0, 0, 2], [2, 0, 1]]}
    got = store.get("T", 0, 0, 10).records
    assert [r.message_id for r in got] == ["a1", "a2"]
    r = got[1]
    assert (r.body, r.tag, r.keys, r.properties["region"], r.born_timestamp, r.born_host) == (
        b"body of a2", "Paid", ["order-a2"], "eu", 1234, HOST)
    # the records' bytes in the log are the producer's, untouched
    s = validate(first, strict=False)
    at = got[0].physical_offset - s.positions[0]
    assert store.log.read_bytes(at + s.positions[0], len(first) - s.positions[0]) == \
        first[s.positions[0]:]
    assert (await svc.send_batches("T", batch(0, ["a3"]), HOST)) == {"batches": [[0, 2, 1]]}


def _corrupt(raw: bytes, how: str) -> bytes:
    buf = bytearray(raw)
    s = validate(raw, strict=False)
    second = s.positions[1]
    if how == "crc":
        buf[-1] ^= 0xFF  # the last record's body
    elif how == "cut short":
        return bytes(buf[:-5])
    elif how == "truncated":  # the batch's size agrees, its last record lost 5 bytes
        del buf[-5:]
        U32.pack_into(buf, 0, len(buf))
        seal(buf, 0)
    elif how == "overrun":  # the second record's body_len says more than the record holds
        U32.pack_into(buf, second + 63, 10_000)
    elif how == "version":
        U32.pack_into(buf, 4, 0x7D1E_0003)
        seal(buf, 0)
    return bytes(buf)


@pytest.mark.parametrize(("how", "where"), [
    ("crc", "batches[1].records[1].crc"),
    ("cut short", "batches[1].batch.total_size"),
    ("truncated", "batches[1].records[1].size"),
    ("overrun", "batches[1].records[1].body_len"),
    ("version", "batches[1].batch.magic"),
])
async def test_a_bad_batch_is_refused_naming_record_and_field_and_nothing_is_stored(
        sent: Any, how: str, where: str) -> None:
    svc, store = sent
    end = store.log.write_offset
    good = batch(0, ["g1"])
    with pytest.raises(ProtocolError) as err:
        await svc.send_batches("T", good + _corrupt(batch(1, ["x1", "x2"]), how), HOST)
    assert err.value.code is ErrorCode.BAD_REQUEST and where in err.value.message
    assert store.log.write_offset == end and store.queue_offsets("T", 0) == (0, 0)


async def test_what_a_public_send_may_not_say(sent: Any) -> None:
    svc, store = sent
    reserved = BatchBuilder("T", 0)
    reserved.add(b"x", "r1", properties={"TRAN_MSG": "true"})
    unselectable = BatchBuilder("T", 0)  # no tag expression could select these (as JSON)
    unselectable.add(b"x", "u1", tag="Paid")
    unselectable.add(b"x", "u2", tag="a||b")
    twice = BatchBuilder("T", 1)  # one id, two messages (as a JSON send: 400)
    twice.add(b"x", "t1")
    twice.add(b"y", "t1")
    cases = [
        (reserved.finish(), ErrorCode.BAD_REQUEST, "records[0].properties: 'TRAN_MSG'"),
        (unselectable.finish(), ErrorCode.BAD_REQUEST, "batches[0].records[1].tag: 'a||b'"),
        (batch(0, ["v1"]) + twice.finish(), ErrorCode.BAD_REQUEST,
         "batches[1].records[1].message_id: 't1' is also batches[1].records[0]"),
        (batch(0, ["o1"], topic="Other"), ErrorCode.BAD_REQUEST, "batches[0].batch.topic"),
        (batch(4, ["q1"]), ErrorCode.BAD_REQUEST, "batches[0].batch.queue_id: 4"),
        (BatchBuilder("T", 0, sys_flag=8), ErrorCode.BAD_REQUEST, "sys_flag"),
        (batch(0, [f"m{i}" for i in range(30)]) + batch(1, [f"n{i}" for i in range(30)]),
         ErrorCode.MESSAGE_TOO_LARGE, "60 messages exceeds the batch limit of 50"),
    ]
    for raw, code, says in cases:
        if isinstance(raw, BatchBuilder):
            raw.add(b"x", "s1")
            raw = raw.finish()
        with pytest.raises(ProtocolError) as err:
            await svc.send_batches("T", raw, HOST)
        assert err.value.code is code and says in err.value.message, err.value.message
    assert store.log.write_offset == 0


async def test_a_repeated_batch_gets_its_first_results_and_is_stored_once(sent: Any) -> None:
    svc, store = sent
    await svc.send_batches("T", batch(1, ["d1", "d2"]), HOST)
    end = store.log.write_offset
    again = await svc.send_batches("T", batch(1, ["d1", "d2"]), HOST)
    assert again == {"results": [{"message_id": "d1", "queue_id": 1, "queue_offset": 0},
                                 {"message_id": "d2", "queue_id": 1, "queue_offset": 1}]}
    assert store.log.write_offset == end
    # a JSON send of the same id is a duplicate too; so is an id twice in one request
    (json_again,) = await svc.send("T", {"messages": [{"message_id": "d2", "body": "x"}]}, HOST)
    assert json_again["queue_offset"] == 1
    mixed = await svc.send_batches("T", batch(1, ["d3", "d1", "d3"]), HOST)
    assert [r["queue_offset"] for r in mixed["results"]] == [2, 0, 2]
    # after a restart the unique-key index answers
    svc.ingest.dedup = DedupCache(600, 1000, now_ms())
    assert (await svc.send_batches("T", batch(1, ["d2"]), HOST))["results"][0][
        "queue_offset"] == 1
    assert store.queue_offsets("T", 1) == (0, 3)


async def test_a_delayed_record_waits_and_the_others_are_stored(sent: Any) -> None:
    svc, store = sent
    b = BatchBuilder("T", 3)
    b.add(b"now", "p1")
    b.add(b"later", "p2", delay_kind=DelayKind.LEVEL, delay_value=2)
    answer = await svc.send_batches("T", b.finish(), HOST)
    now, later = answer["results"]
    assert (now["queue_id"], now["queue_offset"]) == (3, 0)
    assert later["queue_offset"] is None and later["state"] == "scheduled"
    assert [r.message_id for r in store.get(DELAY_LEVEL_TOPIC, 1, 0, 10).records] == ["p2"]
    b = BatchBuilder("T", 3)
    b.add(b"x", "p3", delay_kind=DelayKind.DELIVER_AT_MS, delay_value=now_ms() + 10**12)
    with pytest.raises(ProtocolError) as err:
        await svc.send_batches("T", b.finish(), HOST)
    assert err.value.code is ErrorCode.INVALID_DELAY and "records[0].delay_value" in \
        err.value.message


async def test_a_duplicate_sent_while_the_batch_is_written_waits_for_its_place(
        sent: Any) -> None:
    svc, store = sent
    first, again = await asyncio.gather(
        svc.send_batches("T", batch(0, ["w1"]) + batch(2, ["w2", "w3"]), HOST),
        svc.send("T", {"messages": [{"message_id": "w3", "body": "x"},
                                    {"message_id": "w1", "body": "x"}]}, HOST))
    assert first == {"batches": [[0, 0, 1], [2, 0, 2]]}
    assert [(r["queue_id"], r["queue_offset"]) for r in again] == [(2, 1), (0, 0)]
    assert store.queue_offsets("T", 0) == (0, 1) and store.queue_offsets("T", 2) == (0, 2)


def test_run_places_index_a_write_of_runs() -> None:
    places = RunPlaces([(3, 10, 2, 0), (1, 0, 3, 0)])
    assert len(places) == 5 and list(places) == [
        Placed(3, 10), Placed(3, 11), Placed(1, 0), Placed(1, 1), Placed(1, 2)]
    assert places[1:3] == [Placed(3, 11), Placed(1, 0)]
    with pytest.raises(IndexError):
        places[5]
