"""Stored-form reads (MessageStore.get_stored, store/records/stored.py): the records a pull selects
come back as the log holds them, grouped by batch, and decode to the same messages a decoded
read gives; v1 records, tag filtering and corrupt records are handled on the way."""

from __future__ import annotations

import os
from pathlib import Path

from tidemq.protocol.records.stored import decode_stored

from tests.broker.store.conftest import make_record, small_config
from tests.broker.store.test_mixed_versions import append_v1
from tidemq_server.broker.messaging.convert import to_wire
from tidemq_server.broker.store import MessageStore, tag_code


def same_messages(store: MessageStore, stored: bytes, queue_id: int = 0) -> list[str]:
    """The ids of a stored answer, after checking each against the decoded read."""
    got = decode_stored(stored)
    for m in got:
        (rec,) = store.get("T", queue_id, m.queue_offset, 1).records
        want = to_wire(rec, True)
        assert (m.message_id, m.body, m.tag, m.keys, m.properties, m.queue_offset,
                m.store_timestamp_ms, m.born_timestamp_ms, m.topic) == (
            want["message_id"], want["body"], want["tag"], want["keys"], want["properties"],
            want["queue_offset"], want["store_timestamp_ms"], want["born_timestamp_ms"],
            want["topic"])
    return [m.message_id for m in got]


async def test_a_stored_read_serves_the_logs_bytes_grouped_by_batch(tmp_path: Path) -> None:
    store = await MessageStore.open(small_config(tmp_path / "s"))
    try:
        await store.put([make_record(i) for i in range(5)])
        await store.put([make_record(i) for i in range(5, 8)])
        res = store.get_stored("T", 0, 1, 100)
        assert res.count == 7 and res.next_offset == 8 and res.status.value == "found"
        assert same_messages(store, res.stored) == [f"id-T-{i}" for i in range(1, 8)]
        # one group per batch: two headers, the first holding records 1-4
        assert int.from_bytes(res.stored[:4], "big") == 4
        none = store.get_stored("T", 0, 8, 100)
        assert none.count == 0 and none.stored == b"" and none.status.value == "no_message"
    finally:
        await store.close()


async def test_tags_filter_by_code_and_then_exactly(tmp_path: Path) -> None:
    store = await MessageStore.open(small_config(tmp_path / "s"))
    try:
        await store.put([make_record(i, tag=("a", "b", None)[i % 3]) for i in range(9)])
        res = store.get_stored("T", 0, 0, 100, frozenset({tag_code("b")}), frozenset({b"b"}))
        assert same_messages(store, res.stored) == ["id-T-1", "id-T-4", "id-T-7"]
        assert res.next_offset == 9
        # a record whose tag code matches but whose tag does not (a collision) is left out
        fooled = store.get_stored("T", 0, 0, 100, frozenset({tag_code("b")}),
                                  frozenset({b"other"}))
        assert fooled.count == 0 and fooled.next_offset == 9
    finally:
        await store.close()


async def test_v1_records_and_a_corrupt_record_in_a_stored_read(tmp_path: Path) -> None:
    store = await MessageStore.open(small_config(tmp_path / "s"))
    try:
        append_v1(store, 0)
        res = await store.put([make_record(i) for i in range(1, 4)])
        append_v1(store, 4)
        stored = store.get_stored("T", 0, 0, 100)
        assert same_messages(store, stored.stored) == [f"id-T-{i}" for i in range(5)]
        victim = res.appended[1]  # record 2: flip a byte of its body in the file
        seg = store.log.segments[-1]
        os.pwrite(seg.fd, b"\xff", victim.physical_offset + victim.size - 3 - seg.start)
        again = store.get_stored("T", 0, 0, 100)
        assert [m.message_id for m in decode_stored(again.stored)] == [
            "id-T-0", "id-T-1", "id-T-3", "id-T-4"]  # never served, the others are
    finally:
        await store.close()
