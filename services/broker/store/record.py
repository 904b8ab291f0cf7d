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
The CRC covers everything after itself, so a torn or overwritten record is always detected.
"""

from __future__ import annotations

import ipaddress
import struct
import zlib
from dataclasses import dataclass

from services.broker.store.types import MessageRecord, StoredRecord

FORMAT_VERSION = 1
MAGIC_BASE = 0x7D1E_0000  # high half says "tidemq record"; low half is the format version
MAGIC = MAGIC_BASE | FORMAT_VERSION
BLANK_MAGIC = 0x7D1E_B1A4  # end-of-segment marker
SUPPORTED_VERSIONS = frozenset({1})

HEADER = struct.Struct(">iIIiiqqiq8sq8siqqi")
HEADER_SIZE = HEADER.size  # 96
BLANK = struct.Struct(">iI")
BLANK_SIZE = BLANK.size  # 8
PREFIX = struct.Struct(">iII")  # total_size, magic, crc
STORE_TS = struct.Struct(">q")
STORE_TS_AT = 56
U8 = struct.Struct(">B")
U16 = struct.Struct(">H")
I32 = struct.Struct(">i")

MAX_TOPIC_BYTES = 255
MAX_PROPERTIES_BYTES = 65535
MIN_RECORD_SIZE = HEADER_SIZE + 1 + 2


class CorruptRecord(Exception):
    """A record failed validation (size, magic, CRC or structure) at a physical offset."""

    def __init__(self, offset: int, why: str) -> None:
        super().__init__(f"corrupt record at {offset}: {why}")
        self.offset = offset
        self.why = why


def encode_host(host: str) -> bytes:
    """``"ip:port"`` → 8 bytes; non-IPv4 hosts keep only the port."""
    addr, _, port = host.rpartition(":")
    try:
        ip = ipaddress.IPv4Address(addr).packed
    except ValueError:
        ip = b"\0\0\0\0"
    return ip + struct.pack(">I", int(port) if port.isdigit() else 0)


def decode_host(raw: bytes) -> str:
    return f"{ipaddress.IPv4Address(raw[:4])}:{struct.unpack('>I', raw[4:])[0]}"


def encode_properties(props: dict[str, str]) -> bytes:
    if not props:
        return b""
    return "".join(f"{k}\x01{v}\x02" for k, v in props.items()).encode("utf-8")


def decode_properties(raw: bytes) -> dict[str, str]:
    if not raw:
        return {}
    out: dict[str, str] = {}
    for item in raw.decode("utf-8").split("\x02"):
        if item:
            k, _, v = item.partition("\x01")
            out[k] = v
    return out


def encode_payload(rec: MessageRecord) -> bytes:
    """The variable part of a record (body, topic, properties), built before the writer runs."""
    topic = rec.topic.encode("utf-8")
    props = encode_properties(rec.properties)
    if len(topic) > MAX_TOPIC_BYTES:
        raise ValueError(f"topic is {len(topic)} bytes; the limit is {MAX_TOPIC_BYTES}")
    if len(props) > MAX_PROPERTIES_BYTES:
        raise ValueError(f"properties are {len(props)} bytes; the limit is {MAX_PROPERTIES_BYTES}")
    return b"".join((I32.pack(len(rec.body)), rec.body, U8.pack(len(topic)), topic,
                     U16.pack(len(props)), props))


def encode_header(rec: MessageRecord, total_size: int, queue_offset: int, physical_offset: int,
                  store_timestamp: int, store_host: bytes, payload: bytes) -> bytes:
    """The fixed header with its CRC over everything after the CRC field.

    ``payload`` starts with body_len, which the header layout counts as its last field, so the
    header struct is packed without it and the payload supplies those four bytes.
    """
    head = bytearray(HEADER.pack(
        total_size, MAGIC, 0, rec.queue_id, rec.flag, queue_offset, physical_offset,
        rec.sys_flag, rec.born_timestamp, encode_host(rec.born_host), store_timestamp,
        store_host, rec.reconsume_times, rec.prepared_tx_offset, rec.tag_code, 0,
    ))
    del head[-4:]  # body_len comes from the payload
    crc = zlib.crc32(payload, zlib.crc32(memoryview(head)[12:]))
    struct.pack_into(">I", head, 8, crc)
    return bytes(head)


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


def check(buf: bytes | bytearray | memoryview, pos: int, offset: int) -> int:
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
    size = check(buf, pos, offset)
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
    """Decode what dispatch needs (used by recovery to rebuild consume queues and index)."""
    rec = decode(buf, pos, offset)
    (*_, tag_code, _body_len) = HEADER.unpack_from(buf, pos)
    return RecordMeta(
        physical_offset=offset, size=rec.size, topic=rec.topic, queue_id=rec.queue_id,
        queue_offset=rec.queue_offset, sys_flag=rec.sys_flag, tag_code=tag_code,
        store_timestamp=rec.store_timestamp, unique_key=rec.properties.get("UNIQ_KEY", ""),
        keys=rec.properties.get("KEYS", ""),
    )


def is_blank(buf: bytes | bytearray | memoryview, pos: int) -> bool:
    return len(buf) - pos >= BLANK_SIZE and BLANK.unpack_from(buf, pos)[1] == BLANK_MAGIC


def offset_id(store_host: str, physical_offset: int) -> str:
    """Internal id of a record: store host + physical offset, as 32 hex digits."""
    return (encode_host(store_host) + struct.pack(">q", physical_offset)).hex().upper()
