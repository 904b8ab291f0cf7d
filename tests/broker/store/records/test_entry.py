"""Log entries of either format (store/records/entry.py) and a v2 batch's dispatch: a message
kept as a version-1 record or inside a version-2 batch reads back as the same StoredRecord."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from tidemq.protocol import ReceivedMessage
from tidemq.protocol.records.stored import decode_stored
from tidemq.protocol.records.v2 import BatchBuilder, fill
from tidemq.protocol.records.v2_read import BatchHead, validate

from tidemq_server.broker.messaging.convert import to_wire
from tidemq_server.broker.store.dispatcher import Dispatcher
from tidemq_server.broker.store.index import Index, topic_key, unique_key
from tidemq_server.broker.store.records import v1 as record
from tidemq_server.broker.store.records.entry import (
    V1,
    V2,
    as_group,
    kind_at,
    read_record,
    store_timestamp,
    validate_entry,
)
from tidemq_server.broker.store.records.v1 import CorruptRecord
from tidemq_server.broker.store.types import MessageRecord, StoredRecord, SysFlag, tag_code

STORE_HOST, BORN_HOST, STORE_MS = "10.0.0.1:10911", "192.168.1.2:5555", 1_767_225_601_000


def v1_bytes(rec: MessageRecord, phys: int, queue_offset: int) -> bytes:
    payload = record.encode_payload(rec)
    return record.encode_header(rec, record.HEADER_SIZE - 4 + len(payload), queue_offset, phys,
                                STORE_MS, record.encode_host(STORE_HOST), payload) + payload


def v2_bytes(recs: list[MessageRecord], phys: int, queue_offset: int) -> bytearray:
    b = BatchBuilder(recs[0].topic, recs[0].queue_id, recs[0].sys_flag)
    for r in recs:
        p = dict(r.properties)
        mid, tag, keys = p.pop("UNIQ_KEY"), p.pop("TAGS", None), p.pop("KEYS", "")
        b.add(r.body, mid, tag=tag, keys=keys, properties=p, born_timestamp=r.born_timestamp,
              flag=r.flag, reconsume_times=r.reconsume_times,
              prepared_tx_offset=r.prepared_tx_offset)
    raw = bytearray(b.finish())
    fill(raw, 0, phys, queue_offset, STORE_MS, record.encode_host(STORE_HOST),
         record.encode_host(BORN_HOST))
    return raw


def message(i: int, **kw: object) -> MessageRecord:
    props = {"UNIQ_KEY": f"m-{i}", "TAGS": "Paid", "KEYS": f"order-{i}\x1fuser-7",
             "region": "eu"}
    return MessageRecord("Orders", 2, f"body {i}".encode() * 3, props, tag_code("Paid"),
                         flag=3, born_timestamp=1000 + i, born_host=BORN_HOST,
                         reconsume_times=1, **kw)  # type: ignore[arg-type]


class Log:
    """A commit log in memory: ``read_bytes`` as CommitLog answers it."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.reads = 0

    def append(self, raw: bytes | bytearray) -> int:
        at = len(self.data)
        self.data += raw
        return at

    def read_bytes(self, offset: int, size: int) -> bytes:
        self.reads += 1
        if offset < 0 or offset + size > len(self.data):
            return b""
        return bytes(self.data[offset:offset + size])


def same(a: StoredRecord, b: StoredRecord) -> None:
    skip = {"size"}
    assert {k: v for k, v in dataclasses.asdict(a).items() if k not in skip} == {
        k: v for k, v in dataclasses.asdict(b).items() if k not in skip}


def test_a_message_reads_back_the_same_from_either_version() -> None:
    log = Log()
    old = log.append(v1_bytes(message(0), 0, 5))
    start = len(log.data)
    batch = v2_bytes([message(1), message(2)], start, 6)
    log.append(batch)
    s = validate(batch, strict=False)
    heads: dict[int, BatchHead] = {}
    got = [read_record(log.read_bytes, start + p, n, heads)
           for p, n in zip(s.positions, s.sizes, strict=True)]
    first = read_record(log.read_bytes, old, int.from_bytes(log.data[:4], "big"))
    assert first.queue_offset == 5 and first.message_id == "m-0"
    for i, rec in enumerate(got, start=1):
        want = record.decode(v1_bytes(message(i), rec.physical_offset, 5 + i), 0,
                             rec.physical_offset)
        same(rec, want)
    assert list(heads) == [start]  # one header read serves the batch's records


def test_store_timestamps_of_either_version() -> None:
    log = Log()
    log.append(v1_bytes(message(0), 0, 0))
    start = len(log.data)
    batch = v2_bytes([message(1), message(2)], start, 1)
    log.append(batch)
    s = validate(batch, strict=False)
    assert store_timestamp(log.read_bytes, 0) == STORE_MS
    assert store_timestamp(log.read_bytes, start + s.positions[1]) == STORE_MS
    assert store_timestamp(log.read_bytes, start + s.positions[1] + 3) is None  # no record
    assert store_timestamp(log.read_bytes, len(log.data)) is None


def test_a_record_whose_batch_does_not_hold_it_is_corrupt() -> None:
    log = Log()
    log.append(b"\0" * 100)
    batch = v2_bytes([message(1)], 100, 0)
    log.append(batch)
    s = validate(batch, strict=False)
    at, size = 100 + s.positions[0], s.sizes[0]
    assert read_record(log.read_bytes, at, size).message_id == "m-1"
    log.data[100 + 20] ^= 1  # the header's base_queue_offset, not sealed again
    with pytest.raises(CorruptRecord, match="head_crc"):
        read_record(log.read_bytes, at, size)
    with pytest.raises(CorruptRecord, match="beyond the log's end"):
        read_record(log.read_bytes, at, size + 10)


def test_validate_entry_tells_the_versions_apart() -> None:
    v1 = v1_bytes(message(0), 4096, 0)
    v2 = v2_bytes([message(1), message(2)], 4096, 0)
    assert (kind_at(v1, 0), kind_at(v2, 0)) == (V1, V2)
    assert validate_entry(v1, 0, 4096) is None
    summary = validate_entry(v2, 0, 4096)
    assert summary is not None and summary.message_ids == ["m-1", "m-2"]
    with pytest.raises(CorruptRecord, match="lives at 4096, read at 0"):
        validate_entry(v2, 0, 0)
    with pytest.raises(CorruptRecord, match="neither a record nor a batch"):
        validate_entry(v2, summary.positions[0], 4096 + summary.positions[0])


def test_a_v1_record_serves_as_a_stored_form_group() -> None:
    rec = record.decode(v1_bytes(message(3, prepared_tx_offset=77), 8192, 41), 0, 8192)
    (got,) = decode_stored(as_group(rec))
    assert dataclasses.asdict(got) == dataclasses.asdict(
        ReceivedMessage.from_wire(to_wire(rec, True)))


def test_dispatch_batch_writes_every_unit_and_index_entry(tmp_path: Path) -> None:
    index = Index(tmp_path / "index", 997, 5000)
    index.open()
    disp = Dispatcher(tmp_path / "cq", 50, index)
    disp.load()
    batch = v2_bytes([message(i) for i in range(3)], 4096, 0)
    disp.dispatch_batch(validate(batch, strict=False))
    half = v2_bytes([message(9, sys_flag=int(SysFlag.PREPARED))], 8192, 0)
    disp.dispatch_batch(validate(half, strict=False))
    assert disp.write_pending() == {("Orders", 2)}
    s = validate(batch, strict=False)
    cq = disp.queues[("Orders", 2)]
    assert cq.read_units(0, 10) == [(4096 + p, n, tag_code("Paid"))
                                    for p, n in zip(s.positions, s.sizes, strict=True)]
    assert cq.max_offset == 3  # the half batch got no unit
    assert index.lookup(unique_key("m-1")) == [4096 + s.positions[1]]
    half_at = 8192 + validate(half, strict=False).positions[0]
    assert sorted(index.lookup(topic_key("Orders", "user-7"))) == [
        *(4096 + p for p in s.positions), half_at]  # a half is indexed, not queued
    assert index.lookup(unique_key("m-9")) == [half_at]
    disp.close()
    index.close()
