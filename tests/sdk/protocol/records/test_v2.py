"""Record format v2: what the producer encodes is what readers decode, and every bad batch is
refused with an error naming the record and the field (tidemq.protocol.records.v2, v2_read)."""

from __future__ import annotations

import zlib

import pytest
from tidemq.protocol import ErrorCode
from tidemq.protocol.message import Limits
from tidemq.protocol.records.v2 import (
    HEADER_FIXED,
    MAGIC,
    MAGIC_BASE,
    RECORD_FIXED,
    BatchBuilder,
    DelayKind,
    UnfitBatch,
    encode_batch,
    fill,
    seal,
    tag_code,
)
from tidemq.protocol.records.v2_read import (
    BatchError,
    decode_record,
    read_head,
    split,
    validate,
    version_at,
)

HOST = b"\x0a\x00\x00\x01\x00\x00\x2a\x8f"  # 10.0.0.1:10911


def two_records() -> bytes:
    b = BatchBuilder("Orders", 3)
    b.add(b"paid \x00\xff", "m-1", tag="Paid", keys=["order-42", "user-7"],
          properties={"region": "eu"}, born_timestamp=1_767_225_600_000, flag=5,
          reconsume_times=2)
    b.add(b"x" * 300, "m-2")
    return b.finish()


def test_round_trip_keeps_every_field() -> None:
    raw = two_records()
    s = validate(raw)
    assert (s.head.topic, s.head.queue_id, s.head.sys_flag, s.head.count) == ("Orders", 3, 0, 2)
    assert s.message_ids == ["m-1", "m-2"]
    assert s.keys == ["order-42\x1fuser-7", ""]
    assert s.tag_codes == [tag_code("Paid"), 0]
    assert s.positions[0] == s.head.records_at == HEADER_FIXED + len("Orders")
    assert s.positions[1] == s.positions[0] + s.sizes[0]
    assert s.positions[1] + s.sizes[1] == s.head.size == len(raw)
    assert s.payload_bytes == len(b"paid \x00\xff") + len("region\x01eu\x02") + 300
    first = decode_record(raw, s.positions[0])
    assert (first.message_id, first.tag, first.keys, first.properties, first.body) == (
        "m-1", "Paid", ["order-42", "user-7"], {"region": "eu"}, b"paid \x00\xff")
    assert (first.born_timestamp, first.flag, first.reconsume_times, first.ordinal) == (
        1_767_225_600_000, 5, 2, 0)
    second = decode_record(raw, s.positions[1])
    assert (second.tag, second.keys, second.properties, second.ordinal) == (None, [], {}, 1)


def test_the_broker_fills_its_part_outside_the_records_crcs() -> None:
    raw = two_records()
    before = validate(raw)
    stored = bytearray(raw)
    fill(stored, 0, 8192, 40, 1_767_225_601_000, HOST, b"\x7f\0\0\1\0\0\x30\x39")
    assert stored[HEADER_FIXED:] == raw[HEADER_FIXED:]  # no record byte changed
    s = validate(stored, strict=False, offset=8192)
    assert (s.head.base_physical, s.head.base_queue_offset, s.head.store_timestamp) == (
        8192, 40, 1_767_225_601_000)
    assert (s.head.store_host, s.head.born_host) == (HOST, b"\x7f\0\0\1\0\0\x30\x39")
    assert s.positions == before.positions and s.message_ids == before.message_ids
    with pytest.raises(BatchError, match=r"batch\.base_physical: .* lives at 8192, read at 4096"):
        validate(stored, strict=False, offset=4096)


def test_a_broker_field_changed_without_resealing_fails_the_head_crc() -> None:
    stored = bytearray(two_records())
    fill(stored, 0, 8192, 40, 1, HOST)
    stored[25] ^= 0x01  # base_queue_offset
    with pytest.raises(BatchError, match=r"batch\.head_crc"):
        validate(stored, strict=False)


def test_magic_carries_version_2_and_readers_tell_versions_apart() -> None:
    raw = two_records()
    assert int.from_bytes(raw[4:8], "big") == MAGIC == MAGIC_BASE | 2
    assert version_at(raw, 0) == 2
    s = validate(raw)
    assert version_at(raw, s.positions[1]) is None  # a record's batch_pos is no magic
    assert version_at((MAGIC_BASE | 1).to_bytes(8, "big"), 0) == 1


def _with_magic(raw: bytes, version: int) -> bytearray:
    buf = bytearray(raw)
    buf[4:8] = (MAGIC_BASE | version).to_bytes(4, "big")
    return buf


def test_unknown_version_is_named() -> None:
    with pytest.raises(BatchError, match=r"batch\.magic: unknown format version 7") as exc:
        validate(_with_magic(two_records(), 7))
    assert exc.value.index is None and exc.value.code is ErrorCode.BAD_REQUEST


def _reseal_record(buf: bytearray, p: int) -> None:
    size = int.from_bytes(buf[p:p + 4], "big")
    crc = zlib.crc32(buf[p + 14:p + size], zlib.crc32(buf[p + 4:p + 10]))
    buf[p + 10:p + 14] = crc.to_bytes(4, "big")


def test_wrong_crc_names_the_record() -> None:
    raw = bytearray(two_records())
    s = validate(raw)
    raw[s.positions[1] + s.sizes[1] - 1] ^= 0xFF  # the last body byte of record 1
    with pytest.raises(BatchError, match=r"^BAD_REQUEST: records\[1\]\.crc: ") as exc:
        validate(raw)
    assert (exc.value.index, exc.value.field) == (1, "crc")


def test_truncated_record_names_the_record() -> None:
    raw = bytearray(two_records())
    s = validate(raw)
    cut = raw[:s.positions[1] + 20]  # record 1 torn 20 bytes in; the header says more
    cut[0:4] = len(cut).to_bytes(4, "big")
    seal(cut, 0)
    with pytest.raises(BatchError, match=r"records\[1\]\.size: .*truncated record"):
        validate(cut)


def test_a_size_that_overruns_the_body_names_the_field() -> None:
    raw = bytearray(two_records())
    s = validate(raw)
    p = s.positions[0]
    body_len_at = p + RECORD_FIXED - 4
    raw[body_len_at:body_len_at + 4] = (10_000).to_bytes(4, "big")
    _reseal_record(raw, p)
    with pytest.raises(BatchError, match=r"records\[0\]\.body_len: .*overrun"):
        validate(raw)


def test_a_reserved_property_is_refused_unless_allowed() -> None:
    raw = encode_batch("Orders", 0, [{"body": b"b", "message_id": "a"},
                                     {"body": b"b", "message_id": "b",
                                      "properties": {"SHARDING_KEY": "u-7"}}])
    with pytest.raises(BatchError, match=r"records\[1\]\.properties: 'SHARDING_KEY' is a "
                       "reserved property name"):
        validate(raw)
    assert validate(raw, allowed=frozenset({"SHARDING_KEY"})).head.count == 2
    assert validate(raw, strict=False).head.count == 2  # a stored batch may hold system props


@pytest.mark.parametrize(("record", "field", "code"), [
    ({"message_id": ""}, "message_id", ErrorCode.BAD_REQUEST),
    ({"message_id": "x" * 65}, "message_id", ErrorCode.BAD_REQUEST),
    ({"message_id": "a\x01b"}, "message_id", ErrorCode.BAD_REQUEST),
    ({"tag": "t\x02"}, "tag", ErrorCode.BAD_REQUEST),
    ({"tag": "Paid", "code": 5}, "tag_code", ErrorCode.BAD_REQUEST),
    ({"code": 5}, "tag_code", ErrorCode.BAD_REQUEST),
    ({"keys": ["ok", ""]}, "keys", ErrorCode.BAD_REQUEST),
    ({"body": b"x" * 101}, "body", ErrorCode.MESSAGE_TOO_LARGE),
    ({"properties": {"k": "v" * 60}}, "properties", ErrorCode.MESSAGE_TOO_LARGE),
    ({"delay_kind": 9, "delay_value": 1}, "delay_kind", ErrorCode.INVALID_DELAY),
    ({"delay_kind": DelayKind.LEVEL, "delay_value": 19}, "delay_value", ErrorCode.INVALID_DELAY),
    ({"delay_kind": DelayKind.DELAY_MS, "delay_value": -1}, "delay_value",
     ErrorCode.INVALID_DELAY),
])
def test_strict_checks_name_record_and_field(record: dict[str, object], field: str,
                                             code: ErrorCode) -> None:
    limits = Limits(max_body_bytes=100, max_properties_bytes=50)
    rec = {"body": b"ok", "message_id": "m", **record}
    raw = encode_batch("Orders", 0, [{"body": b"fine", "message_id": "first"}, rec])
    with pytest.raises(BatchError) as exc:
        validate(raw, limits=limits)
    assert (exc.value.index, exc.value.field, exc.value.code) == (1, field, code)
    assert exc.value.message.startswith(f"records[1].{field}: ")
    assert validate(raw, strict=False).head.count == 2  # intact bytes: only the rules refuse it


def test_batch_limits_are_413() -> None:
    limits = Limits(max_batch_messages=2, max_batch_bytes=10)
    three = encode_batch("T", 0, [{"body": b"", "message_id": str(i)} for i in range(3)])
    with pytest.raises(BatchError, match=r"batch\.count: 3 records") as exc:
        validate(three, limits=limits)
    assert exc.value.code is ErrorCode.MESSAGE_TOO_LARGE
    big = encode_batch("T", 0, [{"body": b"123456", "message_id": str(i)} for i in range(2)])
    with pytest.raises(BatchError, match=r"batch\.total_size: batch of 12 bytes") as exc:
        validate(big, limits=limits)
    assert exc.value.code is ErrorCode.MESSAGE_TOO_LARGE


def test_a_request_body_splits_into_its_batches() -> None:
    a, b = two_records(), encode_batch("Orders", 1, [{"body": b"z", "message_id": "z"}])
    assert split(a + b) == [(0, len(a)), (len(a), len(b))]
    with pytest.raises(BatchError, match=r"batches\[1\]\.batch\.total_size: .*cut short"):
        split(a + b[:-1])
    with pytest.raises(BatchError, match=r"batches\[1\]\.batch\.total_size: 3 bytes left"):
        split(a + b"\0\0\0")
    with pytest.raises(BatchError, match="no batch"):
        split(b"")


def test_records_and_headers_the_layout_cannot_hold_are_refused_by_the_encoder() -> None:
    b = BatchBuilder("T", 0)
    with pytest.raises(UnfitBatch, match=r"born_timestamp: .* does not fit"):
        b.add(b"", "m", born_timestamp=2**63)
    with pytest.raises(UnfitBatch, match=r"message_id: 70000 does not fit"):
        b.add(b"", "m" * 70_000)
    with pytest.raises(UnfitBatch, match="at least one record"):
        b.finish()
    with pytest.raises(UnfitBatch, match="topic"):
        BatchBuilder("t" * 256, 0)


def test_add_body_is_add_of_a_bare_record() -> None:
    """The producer's lean call encodes what ``add`` would, and refuses what it refuses."""
    lean, full = BatchBuilder("T", 4), BatchBuilder("T", 4)
    for i, body in enumerate((b"", b"x" * 3000, b"ba")):
        assert lean.add_body(body, f"id-{i}", 1_700_000_000_000 + i) == \
            full.add(body, f"id-{i}", born_timestamp=1_700_000_000_000 + i)
    assert lean.count == 3 and lean.finish() == full.finish()
    b = BatchBuilder("T", 0)
    with pytest.raises(UnfitBatch, match=r"born_timestamp: .* does not fit"):
        b.add_body(b"", "m", 2**63)
    with pytest.raises(UnfitBatch, match=r"message_id: 70000 does not fit"):
        b.add_body(b"", "m" * 70_000, 0)
    assert b.count == 0 and b.nbytes == BatchBuilder("T", 0).nbytes  # nothing half-written
    b.add(b"", "m")
    b.queue_id = 2**31
    with pytest.raises(UnfitBatch, match="queue_id"):
        b.finish()


def test_read_head_alone_checks_a_header_without_its_records() -> None:
    raw = two_records()
    s = validate(raw)
    head = read_head(raw[:s.head.records_at], whole=False)
    assert (head.size, head.topic, head.count) == (len(raw), "Orders", 2)
    with pytest.raises(BatchError, match="total_size"):
        read_head(raw[:s.head.records_at])
