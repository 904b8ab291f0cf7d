"""The store's replication side in-process: chunks out, chunks in at the same offsets (across
segment rolls), CRC checks, truncation of log, consume queues and index lookups."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tidemq.protocol.records.v2 import BatchBuilder, fill
from tidemq.protocol.records.v2_read import validate

from tests.broker.store.conftest import make_record, small_config
from tidemq_server.broker.store import MessageStore, PutStatus, tag_code
from tidemq_server.broker.store.index import unique_key
from tidemq_server.broker.store.replicated import ChunkError


def copy_all(src: MessageStore, dst: MessageStore, max_bytes: int = 10_000) -> int:
    """Ship ``src``'s log to ``dst`` chunk by chunk, as a follower does; returns the chunks."""
    chunks = 0
    while dst.log.write_offset < src.log.write_offset:
        data = src.read_chunk(dst.log.write_offset, max_bytes)
        assert data
        dst.append_replicated(data, dst.log.write_offset)
        chunks += 1
    return chunks


def whole_log(store: MessageStore) -> list[tuple[int, bytes]]:
    return [(seg.start, os.pread(seg.fd, seg.length, 0)) for seg in store.log.segments]


def batch_of(store: MessageStore, phys: int) -> int:
    """Where the v2 batch holding the record at ``phys`` starts (an entry boundary)."""
    return phys - int.from_bytes(store.log.read_bytes(phys + 4, 4), "big")


async def open_pair(tmp_path: Path) -> tuple[MessageStore, MessageStore]:
    return (await MessageStore.open(small_config(tmp_path / "p")),
            await MessageStore.open(small_config(tmp_path / "r")))


async def test_chunks_rebuild_the_same_log_queues_and_index(tmp_path: Path) -> None:
    primary, replica = await open_pair(tmp_path)
    try:
        for i in range(300):  # 64 KiB segments: several rolls
            res = await primary.put([make_record(i, queue_id=i % 3, size=700)])
            assert res.status is PutStatus.OK
        assert len(primary.log.segments) >= 3
        assert copy_all(primary, replica) > len(primary.log.segments)
        assert whole_log(replica) == whole_log(primary)
        for qid in range(3):
            assert replica.queue_offsets("T", qid) == primary.queue_offsets("T", qid)
            got = replica.get("T", qid, 0, 500)
            want = primary.get("T", qid, 0, 500)
            assert [r.physical_offset for r in got.records] == \
                [r.physical_offset for r in want.records]
        found = replica.find_by_unique_key("id-T-123")
        assert [r.physical_offset for r in found] == \
            [r.physical_offset for r in primary.find_by_unique_key("id-T-123")]
        assert replica.find_by_key("T", "k77")
    finally:
        await primary.close()
        await replica.close()


async def test_a_chunk_is_whole_records_and_a_big_record_comes_whole(tmp_path: Path) -> None:
    primary, replica = await open_pair(tmp_path)
    try:
        await primary.put([make_record(i, size=3000) for i in range(5)])
        size = primary.log.write_offset  # one batch
        await primary.put([make_record(i, size=3000) for i in range(5, 7)])
        assert len(primary.read_chunk(0, size + 10)) == size
        assert len(primary.read_chunk(0, 10)) == size  # larger than max_bytes: sent whole
        assert primary.read_chunk(primary.log.write_offset, 1000) == b""
        with pytest.raises(ChunkError):
            primary.read_chunk(7, 1000)  # not a record boundary
    finally:
        await primary.close()
        await replica.close()


async def test_corrupt_or_misplaced_chunks_are_refused_whole(tmp_path: Path) -> None:
    primary, replica = await open_pair(tmp_path)
    try:
        await primary.put([make_record(i) for i in range(10)])
        data = bytearray(primary.read_chunk(0, 100_000))
        with pytest.raises(ChunkError, match="ends at 0"):
            replica.append_replicated(bytes(data), 100)
        data[-5] ^= 0xFF  # the last record's CRC no longer matches
        with pytest.raises(ChunkError, match="corrupt"):
            replica.append_replicated(bytes(data), 0)
        assert replica.log.write_offset == 0  # nothing of the chunk was written
        assert replica.queue_offsets("T", 0) == (0, 0)
    finally:
        await primary.close()
        await replica.close()


async def test_truncate_cuts_log_queues_and_index_then_copying_resumes(tmp_path: Path) -> None:
    primary, replica = await open_pair(tmp_path)
    try:
        appended = [a for k in range(0, 150, 10) for a in (await primary.put(
            [make_record(i, size=900) for i in range(k, k + 10)])).appended]
        copy_all(primary, replica)
        cut = batch_of(primary, appended[60].physical_offset)
        removed = await replica.truncate(cut)
        assert removed == primary.log.write_offset - cut
        assert replica.log.write_offset == cut
        assert replica.queue_offsets("T", 0) == (0, 60)
        assert replica.find_by_unique_key("id-T-100") == []  # its index entry points past the end
        assert [r.queue_offset for r in replica.get("T", 0, 55, 100).records] == \
            list(range(55, 60))
        copy_all(primary, replica)
        assert whole_log(replica) == whole_log(primary)
        assert replica.queue_offsets("T", 0) == (0, 150)
        assert replica.find_by_unique_key("id-T-100")[0].queue_offset == 100
    finally:
        await primary.close()
        await replica.close()


async def test_truncation_survives_a_restart(tmp_path: Path) -> None:
    primary, replica = await open_pair(tmp_path)
    await primary.put([make_record(i) for i in range(10)])
    res = await primary.put([make_record(i) for i in range(10, 40)])
    copy_all(primary, replica)
    cut = batch_of(primary, res.appended[0].physical_offset)
    await replica.truncate(cut)
    await replica.close()
    await primary.close()
    again = await MessageStore.open(small_config(tmp_path / "r"))
    try:
        assert again.queue_offsets("T", 0) == (0, 10)
        assert again.log.write_offset == cut
    finally:
        await again.close()


async def test_visible_offset_hides_records_from_reads(tmp_path: Path) -> None:
    store = await MessageStore.open(small_config(tmp_path / "s"))
    try:
        res = await store.put([make_record(i) for i in range(6)])
        store.visible_offset = res.appended[4].physical_offset
        got = store.get("T", 0, 0, 32)
        assert [r.queue_offset for r in got.records] == [0, 1, 2, 3]
        assert got.max_offset == 4 and got.next_offset == 4
        held = store.get("T", 0, 4, 32)
        assert held.records == [] and held.status.value == "no_message" and held.max_offset == 4
        assert store.find_by_unique_key("id-T-5") == []
        store.visible_offset = None
        assert len(store.get("T", 0, 0, 32).records) == 6
    finally:
        await store.close()


def v2_batch(at: int, queue_offset: int, ids: list[str]) -> bytes:
    """A filled record-format-v2 batch of ``ids`` for T queue 0, as a primary stores it."""
    builder = BatchBuilder("T", 0)
    for mid in ids:
        builder.add(b"v2 body " + mid.encode(), mid, tag="a", keys=["k-" + mid])
    raw = bytearray(builder.finish())
    fill(raw, 0, at, queue_offset, 1_767_225_600_000, b"\x7f\0\0\1\0\0\x27\x0f")
    return bytes(raw)


async def test_v2_batches_ship_as_they_are_beside_v1_records(tmp_path: Path) -> None:
    primary, replica = await open_pair(tmp_path)
    try:
        assert (await primary.put([make_record(0)])).status is PutStatus.OK
        copy_all(primary, replica)
        at = replica.log.write_offset
        first = v2_batch(at, 1, ["b-1", "b-2"])
        second = v2_batch(at + len(first), 3, ["b-3"])
        assert replica.append_replicated(first + second, at) == 3
        assert replica.queue_offsets("T", 0) == (0, 4)
        units = replica.dispatcher.queues[("T", 0)].read_units(1, 3)
        s1, s2 = validate(first, strict=False), validate(second, strict=False)
        assert units == [(at + s1.positions[0], s1.sizes[0], tag_code("a")),
                         (at + s1.positions[1], s1.sizes[1], tag_code("a")),
                         (at + len(first) + s2.positions[0], s2.sizes[0], tag_code("a"))]
        assert replica.index.lookup(unique_key("b-2")) == [at + s1.positions[1]]
        # the replica serves the same entries on to a further replica, each whole
        assert replica.read_chunk(at, 10) == first
        assert replica.read_chunk(at + len(first), 10_000) == second
    finally:
        await primary.close()
        await replica.close()


async def test_a_corrupt_v2_batch_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    primary, replica = await open_pair(tmp_path)
    try:
        at = replica.log.write_offset
        bad = bytearray(v2_batch(at, 0, ["x-1", "x-2"]))
        bad[-1] ^= 0xFF  # the last record's body
        with pytest.raises(ChunkError, match=r"records\[1\]\.crc"):
            replica.append_replicated(bytes(bad), at)
        with pytest.raises(ChunkError, match=r"base_physical"):
            replica.append_replicated(v2_batch(at + 64, 0, ["x-3"]), at)
        assert replica.log.write_offset == at and replica.queue_offsets("T", 0) == (0, 0)
    finally:
        await primary.close()
        await replica.close()


async def test_a_replica_drops_the_recent_key_filter_and_still_finds_copied_ids(
        tmp_path: Path) -> None:
    # fed by a replica the filter costs CPU per record and no replica check reads it; after a
    # promotion the dedup checks must still find what the replica copied (from the index)
    primary, replica = await open_pair(tmp_path)
    try:
        assert replica.track_recent_keys(0)
        await primary.put([make_record(i) for i in range(20)])
        copy_all(primary, replica)
        assert replica.index.filter is None
        found = replica.find_by_unique_key("id-T-7", whole_log=True, since_ms=0)
        assert [r.physical_offset for r in found] == \
            [r.physical_offset for r in primary.find_by_unique_key("id-T-7")]
        assert replica.find_by_unique_key("id-T-99", whole_log=True, since_ms=0) == []
    finally:
        await primary.close()
        await replica.close()
