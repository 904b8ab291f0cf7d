"""One commit log holding v1 records and v2 batches side by side (even inside one segment):
every reader of the store serves both — consume-queue reads, single reads, index lookups,
time lookups — and recovery re-dispatches both, also a batch larger than a scan chunk."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tidemq.protocol.records.v2 import BatchBuilder, fill
from tidemq.protocol.records.v2_read import validate

from tests.broker.store.conftest import make_record, small_config
from tests.support.clock import now_ms
from tidemq_server.broker.store import MessageStore, commitlog, tag_code
from tidemq_server.broker.store.records import v1 as record

STORE_HOST = record.encode_host("10.0.0.1:10911")


def append_v1(store: MessageStore, i: int, queue_id: int = 0) -> None:
    """One v1 record written as the writer of format v1 did (no writer involved)."""
    rec = make_record(i, queue_id=queue_id)
    payload = record.encode_payload(rec)
    clog, cq = store.log, store.dispatcher.queue(rec.topic, queue_id)
    if not clog.fits(record.HEADER_SIZE - 4 + len(payload)):
        clog.roll()
    phys, ts = clog.write_offset, now_ms()
    raw = record.encode_header(rec, record.HEADER_SIZE - 4 + len(payload), cq.max_offset, phys,
                               ts, STORE_HOST, payload) + payload
    clog.write(raw)
    store.dispatcher.dispatch(rec.topic, queue_id, cq.max_offset, phys, len(raw), 0, rec.tag_code,
                              ts, rec.properties["UNIQ_KEY"], rec.properties["KEYS"])
    store.dispatcher.write_pending()


def append_v2(store: MessageStore, first: int, count: int, queue_id: int = 0,
              size: int = 100) -> None:
    """A filled v2 batch of records ``first ..`` written and dispatched from its summary."""
    b = BatchBuilder("T", queue_id)
    for i in range(first, first + count):
        b.add(bytes([i % 251]) * size, f"id-T-{i}", tag="a", keys=[f"k{i}"],
              born_timestamp=1000 + i)
    raw = bytearray(b.finish())
    clog = store.log
    if not clog.fits(len(raw)):
        clog.roll()
    cq = store.dispatcher.queue("T", queue_id)
    fill(raw, 0, clog.write_offset, cq.max_offset, now_ms(), STORE_HOST)
    summary = validate(raw, strict=False, offset=clog.write_offset)
    clog.write(raw)
    store.dispatcher.dispatch_batch(summary)
    store.dispatcher.write_pending()


def check(store: MessageStore, n: int) -> None:
    got = store.get("T", 0, 0, 1000).records
    assert [r.message_id for r in got] == [f"id-T-{i}" for i in range(n)]
    assert [r.queue_offset for r in got] == list(range(n))
    assert [r.body for r in got] == [bytes([i % 251]) * len(r.body) for i, r in enumerate(got)]
    assert all(r.tag == "a" and r.born_timestamp == 1000 + i for i, r in enumerate(got))
    for i in (0, 3, n - 1):
        (hit,) = store.find_by_unique_key(f"id-T-{i}")
        assert hit.queue_offset == i and store.read(hit.physical_offset) == hit
        (keyed,) = store.find_by_key("T", f"k{i}")
        assert keyed.message_id == f"id-T-{i}"
    last = got[-1]
    assert store.offset_for_time("T", 0, last.store_timestamp + 1) == n
    assert store.offset_for_time("T", 0, 0) == 0
    assert store.get("T", 0, 0, 1000, frozenset({tag_code("b")})).records == []


@pytest.mark.parametrize("lost", [False, True], ids=["as closed", "derived files lost"])
async def test_v1_and_v2_entries_read_and_recover_alike(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lost: bool) -> None:
    monkeypatch.setattr(commitlog, "SCAN_CHUNK", 4096)  # the 20-record batch is larger
    root = tmp_path / "store"
    store = await MessageStore.open(small_config(root))
    append_v1(store, 0)
    append_v2(store, 1, 2)  # right after a v1 record, in the same segment
    append_v1(store, 3)
    append_v2(store, 4, 20, size=300)  # ~7.5 KB: more than one scan chunk
    for i in range(24, 200, 4):  # over several 64 KiB segments
        append_v2(store, i, 3, size=900)
        append_v1(store, i + 3)
    assert len(store.log.segments) > 2
    check(store, 200)
    await store.close()
    if lost:
        for gone in ("consumequeue", "index"):
            shutil.rmtree(root / gone)
        (root / "checkpoint").unlink()
    again = await MessageStore.open(small_config(root))
    try:
        assert again.recovered_records == (200 if lost else 0)
        check(again, 200)
    finally:
        await again.close()


async def test_a_torn_batch_at_the_tail_is_cut(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = await MessageStore.open(small_config(root))
    append_v2(store, 0, 3)
    end = store.log.write_offset
    append_v2(store, 3, 3)
    await store.close()
    seg = sorted((root / "commitlog").iterdir())[-1]
    with seg.open("r+b") as f:
        f.truncate(seg.stat().st_size - 10)  # the second batch loses its last bytes
    (root / "checkpoint").unlink()
    again = await MessageStore.open(small_config(root))
    try:
        assert again.log.write_offset == end
        assert [r.message_id for r in again.get("T", 0, 0, 10).records] == [
            "id-T-0", "id-T-1", "id-T-2"]
    finally:
        await again.close()
