"""Commit log record format: pure encode / decode, no I/O.

Byte layout (big-endian), format version 1::

    0   total_size          i32   whole record, header included
    4   magic               u32   MAGIC_BASE | version
    8   crc                 u32   CRC32 of bytes [12, total_size): body, topic, properties and
                                  every header field after this one
    12  queue_id            i32
    16  flag                i32
    20  queue_offset        i64   position in its consume queue (0 when not dispatched)
    28  physical_offset     i64   position of this record in the commit log
    36  sys_flag            i32   transaction type bits (types.SysFlag)
    40  born_timestamp      i64   ms
    48  born_host           8s    IPv4 (4) + port (u32)
    56  store_timestamp     i64   ms
    64  store_host          8s
    72  reconsume_times     i32
    76  prepared_tx_offset  i64
    84  tag_code            i64   consume-queue tag slot (tag hash, or delivery time)
    92  body_len            i32
    96  body                body_len bytes
        topic_len           u8,  topic (utf-8)
        properties_len      u16, properties: name \\x01 value \\x02 ... (utf-8)

A segment's unused tail starts with an 8-byte blank marker ``(remaining, BLANK_MAGIC)``.

Format version 2 (the batch the producer builds and the log stores as it is) is laid out byte
by byte in ``tidemq.protocol.records.v2``, the protocol module the SDK and the broker share; its
magic has this version's high half and its low half says 2.
The CRC covers everything after itself, so a torn or overwritten record is always detected.
"""

from __future__ import annotations

import ipaddress
import struct
import zlib
from dataclasses import dataclass
from functools import lru_cache

from tidemq.protocol import KEYS, UNIQ_KEY
from tidemq.protocol.numbers import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN
from tidemq.protocol.records.v2 import decode_properties, encode_properties  # the v2 format's too

from tidemq_server.broker.store.types import MessageRecord, StoredRecord

FORMAT_VERSION = 1
MAGIC_BASE = 0x7D1E_0000  # high half says "tidemq record"; low half is the format version
MAGIC = MAGIC_BASE | FORMAT_VERSION
BLANK_MAGIC = 0x7D1E_B1A4  # end-of-segment marker
SUPPORTED_VERSIONS = frozenset({1})

HEADER = struct.Struct(">iIIiiqqiq8sq8siqqi")
HEADER_SIZE = HEADER.size  # 96
HEAD = struct.Struct(">iIIiiqqiq8sq8siqq")  # the header up to body_len (the payload starts it)
HEAD_SIZE = HEAD.size  # 92
CRC = struct.Struct(">I")
META = struct.Struct(">iIIiiqqi44xq")  # what dispatch needs: ... sys_flag, (skip), tag_code
BLANK = struct.Struct(">iI")
BLANK_SIZE = BLANK.size  # 8
PREFIX = struct.Struct(">iII")  # total_size, magic, crc
STORE_TS = struct.Struct(">q")
STORE_TS_AT = 56
POSITION = struct.Struct(">qq")  # queue_offset, physical_offset: known when written
POSITION_AT = 20
U8 = struct.Struct(">B")
U16 = struct.Struct(">H")
I32 = struct.Struct(">i")

MAX_TOPIC_BYTES = 255
MAX_PROPERTIES_BYTES = 65535
MIN_RECORD_SIZE = HEADER_SIZE + 1 + 2

I32_RANGE = (INT32_MIN, INT32_MAX)  # what an i32 header field holds
I64_RANGE = (INT64_MIN, INT64_MAX)  # what an i64 header field holds
MAX_PORT = 2**32 - 1  # the port half of a host field (u32)
#: The integer fields of a MessageRecord and the range of the header slot each is written to.
FIELD_RANGES: dict[str, tuple[int, int]] = {
    "queue_id": I32_RANGE, "flag": I32_RANGE, "sys_flag": I32_RANGE,
    "born_timestamp": I64_RANGE, "reconsume_times": I32_RANGE,
    "prepared_tx_offset": I64_RANGE, "tag_code": I64_RANGE,
}


class CorruptRecord(Exception):
    """A record failed validation (size, magic, CRC or structure) at a physical offset."""

    def __init__(self, offset: int, why: str) -> None:
        super().__init__(f"corrupt record at {offset}: {why}")
        self.offset = offset
        self.why = why


@lru_cache(maxsize=4096)
def encode_host(host: str) -> bytes:
    """``"ip:port"`` → 8 bytes; non-IPv4 hosts keep only the port."""
    addr, _, port = host.rpartition(":")
    try:
        ip = ipaddress.IPv4Address(addr).packed
    except ValueError:
        ip = b"\0\0\0\0"
    return ip + struct.pack(">I", int(port) if port.isdigit() else 0)


@lru_cache(maxsize=4096)
def decode_host(raw: bytes) -> str:
    return f"{ipaddress.IPv4Address(raw[:4])}:{struct.unpack('>I', raw[4:])[0]}"


@lru_cache(maxsize=65536)
def _topic_field(topic: str) -> bytes:
    raw = topic.encode("utf-8")
    if len(raw) > MAX_TOPIC_BYTES:
        raise ValueError(f"topic is {len(raw)} bytes; the limit is {MAX_TOPIC_BYTES}")
    return U8.pack(len(raw)) + raw


class UnfitRecord(ValueError):
    """A record whose fields the layout cannot hold; the message names the field."""


def validate_fits(rec: MessageRecord) -> None:
    """Raise UnfitRecord unless every header field of ``rec`` fits its slot."""
    encode_head(rec, b"")


def encode_head(rec: MessageRecord, store_host: bytes) -> bytes:
    """The header of ``rec`` up to body_len with what is known before it is written; the
    writer's ``append_encoded`` fills in total_size, queue_offset, physical_offset,
    store_timestamp and the CRC. Raises UnfitRecord unless every field fits its slot: packing
    decides, so the writer never meets a field it cannot pack; only a failure looks field by
    field for the one to name."""
    try:
        return HEAD.pack(0, MAGIC, 0, rec.queue_id, rec.flag, 0, 0, rec.sys_flag,
                         rec.born_timestamp, encode_host(rec.born_host), 0, store_host,
                         rec.reconsume_times, rec.prepared_tx_offset, rec.tag_code)
    except (struct.error, TypeError, ValueError, AttributeError):
        raise UnfitRecord(_unfit_field(rec)) from None


def _unfit_field(rec: MessageRecord) -> str:
    for name, (low, high) in FIELD_RANGES.items():
        value = getattr(rec, name)
        if type(value) is not int or not low <= value <= high:
            return f"{name} {value!r} does not fit the record: an integer from {low} to {high}"
    return (f"born_host {rec.born_host!r} does not fit the record: 'ipv4:port' with a port "
            f"from 0 to {MAX_PORT}")


def encode_payload(rec: MessageRecord) -> bytes:
    """The variable part of a record (body, topic, properties), built before the writer runs."""
    props = encode_properties(rec.properties)
    if len(props) > MAX_PROPERTIES_BYTES:
        raise ValueError(f"properties are {len(props)} bytes; the limit is {MAX_PROPERTIES_BYTES}")
    return b"".join((I32.pack(len(rec.body)), rec.body, _topic_field(rec.topic),
                     U16.pack(len(props)), props))


def append_record(buf: bytearray, rec: MessageRecord, total_size: int, queue_offset: int,
                  physical_offset: int, store_timestamp: int, store_host: bytes,
                  payload: bytes) -> None:
    """Append one whole record to ``buf``: the header, its CRC, then the payload.

    ``payload`` starts with body_len, the header layout's last field, so the header is packed
    without it.
    """
    head = HEAD.pack(
        total_size, MAGIC, 0, rec.queue_id, rec.flag, queue_offset, physical_offset,
        rec.sys_flag, rec.born_timestamp, encode_host(rec.born_host), store_timestamp,
        store_host, rec.reconsume_times, rec.prepared_tx_offset, rec.tag_code,
    )
    crc = zlib.crc32(payload, zlib.crc32(memoryview(head)[12:]))
    at = len(buf)
    buf += head
    CRC.pack_into(buf, at + 8, crc)
    buf += payload


def append_encoded(buf: bytearray, head: bytes, payload: bytes, queue_offset: int,
                   physical_offset: int, store_timestamp: int) -> None:
    """``append_record`` for a record whose ``encode_head`` and ``encode_payload`` were made
    before: fills in the fields known only now, then the CRC."""
    at = len(buf)
    buf += head
    I32.pack_into(buf, at, HEAD_SIZE + len(payload))
    POSITION.pack_into(buf, at + POSITION_AT, queue_offset, physical_offset)
    STORE_TS.pack_into(buf, at + STORE_TS_AT, store_timestamp)
    with memoryview(buf) as view:  # released before buf grows again
        crc = zlib.crc32(payload, zlib.crc32(view[at + 12:]))
    CRC.pack_into(buf, at + 8, crc)
    buf += payload


def encode_header(rec: MessageRecord, total_size: int, queue_offset: int, physical_offset: int,
                  store_timestamp: int, store_host: bytes, payload: bytes) -> bytes:
    """The 92 header bytes that precede ``payload`` (see ``append_record``)."""
    buf = bytearray()
    append_record(buf, rec, total_size, queue_offset, physical_offset, store_timestamp,
                  store_host, b"")
    crc = zlib.crc32(payload, zlib.crc32(memoryview(buf)[12:]))
    CRC.pack_into(buf, 8, crc)
    return bytes(buf)


@dataclass(slots=True)
class RecordMeta:
    """What dispatch needs from a record, without its body."""

    physical_offset: int
    size: int
    topic: str
    queue_id: int
    queue_offset: int
    sys_flag: int
    tag_code: int
    store_timestamp: int
    unique_key: str
    keys: str


def validate(buf: bytes | bytearray | memoryview, pos: int, offset: int) -> int:
    """Validate the record at ``buf[pos:]``; return its size or raise CorruptRecord."""
    if len(buf) - pos < PREFIX.size:
        raise CorruptRecord(offset, "truncated header")
    size, magic, crc = PREFIX.unpack_from(buf, pos)
    if magic & 0xFFFF_0000 != MAGIC_BASE or (magic & 0xFFFF) not in SUPPORTED_VERSIONS:
        raise CorruptRecord(offset, f"bad magic {magic:#x}")
    if size < MIN_RECORD_SIZE or pos + size > len(buf):
        raise CorruptRecord(offset, f"bad size {size}")
    if zlib.crc32(memoryview(buf)[pos + 12:pos + size]) != crc:
        raise CorruptRecord(offset, "CRC mismatch")
    return int(size)


def decode(buf: bytes | bytearray | memoryview, pos: int, offset: int) -> StoredRecord:
    """Decode a CRC-checked record at ``buf[pos:]`` whose physical offset is ``offset``."""
    size = validate(buf, pos, offset)
    (_, _, _, queue_id, flag, queue_offset, physical_offset, sys_flag, born_ts, born_host,
     store_ts, store_host, reconsume, prepared, _tag, body_len) = HEADER.unpack_from(buf, pos)
    if physical_offset != offset:
        raise CorruptRecord(offset, f"record says it lives at {physical_offset}")
    p = pos + HEADER_SIZE
    body = bytes(buf[p:p + body_len])
    p += body_len
    topic_len = buf[p]
    topic = bytes(buf[p + 1:p + 1 + topic_len]).decode("utf-8")
    p += 1 + topic_len
    (props_len,) = U16.unpack_from(buf, p)
    props = decode_properties(bytes(buf[p + 2:p + 2 + props_len]))
    if p + 2 + props_len != pos + size:
        raise CorruptRecord(offset, "field lengths disagree with the record size")
    return StoredRecord(
        physical_offset=offset, size=size, topic=topic, queue_id=queue_id,
        queue_offset=queue_offset, body=body, properties=props, flag=flag, sys_flag=sys_flag,
        born_timestamp=born_ts, born_host=decode_host(born_host), store_timestamp=store_ts,
        store_host=decode_host(store_host), reconsume_times=reconsume,
        prepared_tx_offset=prepared,
    )


def decode_meta(buf: bytes | bytearray | memoryview, pos: int, offset: int) -> RecordMeta:
    """What dispatch needs from a record that ``check`` already validated (recovery's path):
    one header unpack and the properties, no body copy and no second CRC pass."""
    size, _, _, queue_id, _, queue_offset, physical_offset, sys_flag, tag_code = \
        META.unpack_from(buf, pos)
    if physical_offset != offset:
        raise CorruptRecord(offset, f"record says it lives at {physical_offset}")
    (store_ts,) = STORE_TS.unpack_from(buf, pos + STORE_TS_AT)
    (body_len,) = I32.unpack_from(buf, pos + HEADER_SIZE - 4)
    p = pos + HEADER_SIZE + body_len
    topic_len = buf[p]
    topic = bytes(buf[p + 1:p + 1 + topic_len]).decode("utf-8")
    p += 1 + topic_len
    (props_len,) = U16.unpack_from(buf, p)
    props = decode_properties(bytes(buf[p + 2:p + 2 + props_len]))
    return RecordMeta(
        physical_offset=offset, size=size, topic=topic, queue_id=queue_id,
        queue_offset=queue_offset, sys_flag=sys_flag, tag_code=tag_code,
        store_timestamp=store_ts, unique_key=props.get(UNIQ_KEY, ""),
        keys=props.get(KEYS, ""),
    )


def is_blank(buf: bytes | bytearray | memoryview, pos: int) -> bool:
    return len(buf) - pos >= BLANK_SIZE and BLANK.unpack_from(buf, pos)[1] == BLANK_MAGIC


