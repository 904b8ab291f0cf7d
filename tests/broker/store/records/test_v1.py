from __future__ import annotations

import zlib

import pytest

from tidemq_server.broker.store.records import v1 as record
from tidemq_server.broker.store.types import MessageRecord


def _pack(rec: MessageRecord, phys: int = 4096, qoff: int = 7) -> bytes:
    payload = record.encode_payload(rec)
    size = record.HEADER_SIZE - 4 + len(payload)
    return record.encode_header(rec, size, qoff, phys, 123456, record.encode_host("10.0.0.1:10911"),
                                payload) + payload


def test_round_trip_keeps_every_field() -> None:
    rec = MessageRecord("Topic-1", 3, b"\x00\xffbody", {"UNIQ_KEY": "m1", "TAGS": "t", "x": "y"},
                        tag_code=99, flag=5, sys_flag=8, born_timestamp=42,
                        born_host="192.168.1.2:5555", reconsume_times=2, prepared_tx_offset=77)
    raw = _pack(rec)
    out = record.decode(raw, 0, 4096)
    assert (out.topic, out.queue_id, out.body, out.properties) == (
        rec.topic, 3, rec.body, rec.properties)
    assert (out.flag, out.sys_flag, out.born_timestamp, out.reconsume_times) == (5, 8, 42, 2)
    assert out.prepared_tx_offset == 77 and out.queue_offset == 7 and out.size == len(raw)
    assert out.born_host == "192.168.1.2:5555" and out.store_host == "10.0.0.1:10911"
    assert out.store_timestamp == 123456 and out.message_id == "m1"
    assert record.decode_meta(raw, 0, 4096).tag_code == 99


def test_magic_carries_the_format_version() -> None:
    raw = _pack(MessageRecord("T", 0, b"x"))
    magic = int.from_bytes(raw[4:8], "big")
    assert magic & 0xFFFF == record.FORMAT_VERSION
    assert magic & 0xFFFF0000 == record.MAGIC_BASE


@pytest.mark.parametrize("where", [4, 8, 13, 30, 60, 97, -3])
def test_any_flipped_byte_is_detected(where: int) -> None:
    raw = bytearray(_pack(MessageRecord("T", 0, b"hello world", {"UNIQ_KEY": "a"})))
    raw[where] ^= 0x40
    with pytest.raises(record.CorruptRecord):
        record.decode(raw, 0, 4096)


def test_wrong_physical_offset_is_refused() -> None:
    raw = _pack(MessageRecord("T", 0, b"x"), phys=100)
    with pytest.raises(record.CorruptRecord, match="lives at 100"):
        record.decode(raw, 0, 200)


def test_crc_covers_everything_after_itself() -> None:
    raw = _pack(MessageRecord("T", 0, b"abc"))
    assert int.from_bytes(raw[8:12], "big") == zlib.crc32(raw[12:])


