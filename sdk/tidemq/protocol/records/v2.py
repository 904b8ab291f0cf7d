"""Record format version 2: the batch the producer builds and the commit log stores as it is.

Pure layout and encoding, no I/O (``v2_read`` decodes and validates). The producer writes a
batch once; the broker checks it, writes its own fields into the header's broker part (outside
every producer checksum), appends it with one write and dispatches it from a summary; a pull
serves the stored record bytes and the consumer decodes them.

Byte layout (big-endian). A batch::

    0   total_size         u32   the whole batch, header included
    4   magic              u32   MAGIC_BASE | 2 (the low half is the format version)
    8   head_crc           u32   CRC32 of bytes [0, 8) then [12, records_at): the header
                                 without this field. The producer computes it with the broker
                                 part zero; the broker computes it again after filling that part
    --- broker part: zero as sent, filled by the broker when it appends the batch
    12  base_physical      i64   commit log offset of the batch's first byte
    20  base_queue_offset  i64   queue offset of record 0: record i has base_queue_offset + i
                                 (0 when the batch is not dispatched to a consume queue)
    28  store_timestamp    i64   ms since epoch, when the broker appended the batch
    36  store_host         8s    the broker: IPv4 (4) + port (u32)
    44  born_host          8s    the sender as the broker saw it: IPv4 (4) + port (u32)
    --- producer part
    52  attributes         u16   reserved: 0 (a later compression or layout flag)
    54  count              u16   records in the batch, at least 1
    56  queue_id           i32   the queue every record of the batch goes to
    60  sys_flag           i32   transaction type bits of every record (0: a plain message)
    64  topic_len          u8
    65  topic              topic_len bytes, utf-8
    records_at = 65 + topic_len: ``count`` records, back to back, up to total_size

A record::

    0   size               u32   this record, these 4 bytes included
    4   batch_pos          u32   from the batch's first byte to this record's first byte
    8   ordinal            u16   this record's index in its batch (0, 1, ...)
    10  crc                u32   CRC32 of bytes [4, 10) then [14, size): the record without its
                                 size and without this field
    14  flag               i32   the user's flag
    18  reconsume_times    i32
    22  born_timestamp     i64   ms since epoch, when the producer made the message
    30  tag_code           i64   consume-queue tag slot: crc32(tag) + 1, 0 without a tag
    38  prepared_tx_offset i64   a commit or rollback: physical offset of its half message
    46  delay_value        i64   by delay_kind: a level, a relative delay (ms) or an epoch ms
    54  delay_kind         u8    0 none, 1 level, 2 delay_ms, 3 deliver_at_ms (DelayKind)
    55  id_len             u16   then the message id (utf-8)
    57  tag_len            u16   then the tag (utf-8)
    59  keys_len           u16   then the keys (utf-8, joined by \\x1f)
    61  props_len          u16   then the properties: name \\x01 value \\x02 ... (utf-8)
    63  body_len           u32   then the body; it ends the record
    67  message id, tag, keys, properties, body

Rules:
- A record's CRC binds it to its place (``batch_pos``, ``ordinal``), so a record served alone
  still proves its queue offset; a broker that drops records from a batch (duplicates of a
  retry) encodes the remaining records again. ``size`` is outside every checksum: readers check
  it against the field lengths and the records must tile the batch exactly.
- A commit log reader tells a v2 record from a v1 record by the u32 at byte 4: a v1 record (and
  a batch header) has its magic there, whose high half is ``MAGIC_BASE``'s; a v2 record has
  ``batch_pos`` there, always below 2^31. A consume-queue unit of a v2 record points at the
  record, and ``offset - batch_pos`` is its batch's header.
- The checksums cover every byte the producer wrote (per record, so a CRC error names the
  record) and the header once filled, so a torn or overwritten batch is always detected.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from enum import IntEnum

from tidemq.protocol.properties import SHARDING_KEY
from tidemq.protocol.records._compiled import core

FORMAT_VERSION = 2
MAGIC_BASE = 0x7D1E_0000  # shared with format version 1 (services/broker/store/records/v1.py)
MAGIC = MAGIC_BASE | FORMAT_VERSION
MAGIC_HIGH = 0xFFFF_0000  # the half of a magic that says "tidemq"
CONTENT_BATCH = "application/x-tidemq-batch"  # a request body of one or more batches

#: total_size, magic, head_crc: the prefix of every batch (and of every v1 record).
PREFIX = struct.Struct(">III")
#: The broker part: base_physical, base_queue_offset, store_timestamp, store_host, born_host.
BROKER = struct.Struct(">qqq8s8s")
BROKER_AT = 12
#: The producer part up to the topic: attributes, count, queue_id, sys_flag, topic_len.
PRODUCER = struct.Struct(">HHiiB")
PRODUCER_AT = BROKER_AT + BROKER.size  # 52
HEADER_FIXED = PRODUCER_AT + PRODUCER.size  # 65: records_at = HEADER_FIXED + topic_len
#: The whole fixed header in one unpack (what a reader of a batch wants first).
HEADER = struct.Struct(">III" + "qqq8s8s" + "HHiiB")
assert HEADER.size == HEADER_FIXED

#: A record's place: batch_pos, ordinal (bytes [4, 10), under the record's CRC).
PLACE = struct.Struct(">IH")
PLACE_AT = 4
CRC_AT = PLACE_AT + PLACE.size  # 10
CRC = struct.Struct(">I")
CRC_FROM = CRC_AT + CRC.size  # 14: a record's CRC covers [4, 10) and [14, size)
LEAD = struct.Struct(">IIHI")  # size, batch_pos, ordinal, crc: the record up to CRC_FROM
#: The fields after the CRC up to the variable parts (what the producer packs per record).
FIELDS = struct.Struct(">iiqqqqBHHHHI")
RECORD = struct.Struct(">IIHI" + "iiqqqqBHHHHI")  # a record's fixed part in one unpack
RECORD_FIXED = RECORD.size  # 67
assert RECORD_FIXED == CRC_FROM + FIELDS.size
U32 = struct.Struct(">I")
I64 = struct.Struct(">q")

MAX_TOPIC_BYTES = 255
MAX_COUNT = 0xFFFF  # records in one batch (the API's batch limit is lower)
MAX_U16 = 0xFFFF  # id, tag, keys and properties lengths (bytes)
MAX_BATCH_POS = 2**31 - 1  # so a record can never be read as a magic (see the rules)
NO_HOST = b"\0" * 8

#: Reserved properties a client may set in a record of a public send (the broker's ``allowed``).
CLIENT_PROPERTIES = frozenset({SHARDING_KEY})
KEY_SEPARATOR = "\x1f"  # joins a message's keys
PROPERTY_SEPARATOR = "\x01"  # between a property's name and its value
PROPERTY_END = "\x02"  # after each property's value


class DelayKind(IntEnum):
    """What a record's ``delay_value`` means."""

    NONE = 0  # delivered at once
    LEVEL = 1  # a delay level (1-based)
    DELAY_MS = 2  # a delay counted from when the broker receives it (ms)
    DELIVER_AT_MS = 3  # an epoch ms


def tag_code(tag: str | None) -> int:
    """The 64-bit consume-queue slot value of a tag (0: no tag)."""
    if not tag:
        return 0
    return zlib.crc32(tag.encode("utf-8")) + 1


def encode_properties(props: Mapping[str, str]) -> bytes:
    """``name \\x01 value \\x02`` for each property, utf-8 (empty for none)."""
    if not props:
        return b""
    if len(props) == 1:
        for k, v in props.items():
            return f"{k}\x01{v}\x02".encode()
    return "".join([f"{k}\x01{v}\x02" for k, v in props.items()]).encode("utf-8")


def decode_properties(raw: bytes | bytearray | memoryview) -> dict[str, str]:
    """The inverse of ``encode_properties``; raises UnicodeDecodeError for bytes not utf-8."""
    if not raw:
        return {}
    out: dict[str, str] = {}
    for item in str(raw, "utf-8").split(PROPERTY_END):
        if item:
            k, _, v = item.partition(PROPERTY_SEPARATOR)
            out[k] = v
    return out


class UnfitBatch(ValueError):
    """A record or header field that the layout cannot hold (the encoder's error; the message
    names the field). Readers raise ``v2_read.BatchError`` instead."""


class BatchBuilder:
    """Builds one batch for one (topic, queue), a record at a time.

    ``add`` encodes a record (and its CRC) at once, so a batch costs nothing more when it is
    sent; ``finish`` writes the header and returns the bytes. A builder is used once.
    """

    __slots__ = ("_buf", "_count", "_records_at", "_topic", "queue_id", "sys_flag")

    def __init__(self, topic: str, queue_id: int, sys_flag: int = 0) -> None:
        raw = topic.encode("utf-8")
        if not raw or len(raw) > MAX_TOPIC_BYTES:
            raise UnfitBatch(f"topic: {len(raw)} bytes; a batch holds 1-{MAX_TOPIC_BYTES}")
        self._topic = raw
        self.queue_id = queue_id
        self.sys_flag = sys_flag
        self._records_at = HEADER_FIXED + len(raw)
        self._buf = bytearray(self._records_at)  # the header is written by finish()
        self._count = 0

    @property
    def count(self) -> int:
        return self._count

    @property
    def nbytes(self) -> int:
        """The batch's size so far (header included)."""
        return len(self._buf)

    def add(self, body: bytes, message_id: str, *, tag: str | None = None,
            keys: str | Sequence[str] = "", properties: Mapping[str, str] | None = None,
            born_timestamp: int = 0, delay_kind: int = 0, delay_value: int = 0,
            flag: int = 0, reconsume_times: int = 0, prepared_tx_offset: int = 0,
            code: int | None = None) -> int:
        """Append one record; returns its size. ``keys`` is a list or the joined form;
        ``code`` overrides the tag code (a delay-level record's due time)."""
        buf = self._buf
        pos = len(buf)
        n = self._count
        if n >= MAX_COUNT or pos > MAX_BATCH_POS:
            raise UnfitBatch(f"a batch holds at most {MAX_COUNT} records" if n >= MAX_COUNT else
                             f"batch_pos: a record cannot start {pos} bytes into a batch")
        mid = message_id.encode("utf-8")
        if tag or keys or properties:
            tg = tag.encode("utf-8") if tag else b""
            ks = (keys if isinstance(keys, str) else KEY_SEPARATOR.join(keys)).encode("utf-8") \
                if keys else b""
            props = encode_properties(properties) if properties else b""
            if code is None:
                code = zlib.crc32(tg) + 1 if tg else 0
        else:  # the common message: a body and its id
            tg = ks = props = b""
            if code is None:
                code = 0
        try:
            size = append_record(buf, n, mid, tg, ks, props, body, flag, reconsume_times,
                                 born_timestamp, code, prepared_tx_offset, delay_value,
                                 delay_kind)
        except struct.error:
            raise UnfitBatch(_unfit(flag, reconsume_times, born_timestamp, code,
                                    prepared_tx_offset, delay_value, delay_kind, mid, tg, ks,
                                    props, body)) from None
        self._count = n + 1
        return size

    def add_body(self, body: bytes, message_id: str, born_timestamp: int) -> int:
        """``add(body, message_id, born_timestamp=...)`` of a record with nothing else (no
        tag, keys, properties, delay or flag): the producer's common message, without
        ``add``'s keyword arguments to bind (~0.5 µs a record). Returns its size."""
        buf = self._buf
        n = self._count
        if n < MAX_COUNT and len(buf) <= MAX_BATCH_POS:
            try:
                size = append_record(buf, n, message_id.encode("utf-8"), b"", b"", b"", body,
                                     0, 0, born_timestamp, 0, 0, 0, 0)
            except struct.error:
                pass  # add names the field that does not fit
            else:
                self._count = n + 1
                return size
        return self.add(body, message_id, born_timestamp=born_timestamp)

    def finish(self) -> bytes:
        """The batch's bytes; raises UnfitBatch for a batch without records."""
        return close_batch(self._buf, self._count, self.queue_id, self.sys_flag, self._topic,
                           self._records_at)


def close_batch(buf: bytearray, count: int, queue_id: int, sys_flag: int, topic: bytes,
                records_at: int) -> bytes:
    """The bytes of a batch whose ``count`` records are in ``buf`` from ``records_at``: its
    producer header, topic, length and magic written and the batch sealed (its CRC). Raises
    UnfitBatch for no records, or a queue id or flag that does not fit an i32. The SDK's
    ``BatchBuilder`` and the broker's commit copies (store/records/v2_copy.py) close alike."""
    if not count:
        raise UnfitBatch("count: a batch holds at least one record")
    try:
        PRODUCER.pack_into(buf, PRODUCER_AT, 0, count, queue_id, sys_flag, len(topic))
    except struct.error:
        raise UnfitBatch(f"queue_id {queue_id!r} or sys_flag {sys_flag!r} does not fit an "
                         "i32") from None
    buf[HEADER_FIXED:records_at] = topic
    U32.pack_into(buf, 0, len(buf))
    U32.pack_into(buf, 4, MAGIC)
    seal(buf, 0)
    return bytes(buf)


def append_record(buf: bytearray, ordinal: int, mid: bytes, tag: bytes, keys: bytes,
                  props: bytes, body: bytes, flag: int, reconsume: int, born: int, code: int,
                  prepared: int, delay_value: int, delay_kind: int) -> int:
    """Append one record (its fields encoded, its CRC computed) at the end of ``buf``, the
    batch being built; returns its size. struct.error when a field does not fit."""
    pos = len(buf)
    fields = FIELDS.pack(flag, reconsume, born, code, prepared, delay_value, delay_kind,
                         len(mid), len(tag), len(keys), len(props), len(body))
    tail = b"".join((fields, mid, tag, keys, props, body))
    size = CRC_FROM + len(tail)
    buf += LEAD.pack(size, pos, ordinal,
                     zlib.crc32(tail, zlib.crc32(PLACE.pack(pos, ordinal))))
    buf += tail
    return size


def _unfit(flag: int, reconsume: int, born: int, code: int, prepared: int,
           delay_value: int, delay_kind: int, mid: bytes, tag: bytes, keys: bytes,
           props: bytes, body: bytes) -> str:
    """Which field ``FIELDS.pack`` refused, for the error message."""
    i32, i64 = (-(2**31), 2**31 - 1), (-(2**63), 2**63 - 1)
    for name, value, (low, high) in (
            ("flag", flag, i32), ("reconsume_times", reconsume, i32),
            ("born_timestamp", born, i64), ("tag_code", code, i64),
            ("prepared_tx_offset", prepared, i64), ("delay_value", delay_value, i64),
            ("delay_kind", delay_kind, (0, 255)), ("message_id", len(mid), (0, MAX_U16)),
            ("tag", len(tag), (0, MAX_U16)), ("keys", len(keys), (0, MAX_U16)),
            ("properties", len(props), (0, MAX_U16)), ("body", len(body), (0, 2**32 - 1))):
        if type(value) is not int or not low <= value <= high:
            return f"{name}: {value!r} does not fit the record ({low} to {high})"
    return "a record field does not fit the layout"


def seal(buf: bytearray, at: int) -> None:
    """Write the head CRC of the batch header at ``buf[at:]`` (after its fields changed)."""
    records_at = at + HEADER_FIXED + buf[at + HEADER_FIXED - 1]
    with memoryview(buf) as view:
        crc = zlib.crc32(view[at + BROKER_AT:records_at], zlib.crc32(view[at:at + 8]))
    U32.pack_into(buf, at + 8, crc)


def fill(buf: bytearray, at: int, base_physical: int, base_queue_offset: int,
         store_timestamp: int, store_host: bytes, born_host: bytes = NO_HOST) -> None:
    """The broker's step: write the broker part of the batch at ``buf[at:]`` and seal it."""
    BROKER.pack_into(buf, at + BROKER_AT, base_physical, base_queue_offset, store_timestamp,
                     store_host, born_host)
    seal(buf, at)


def encode_batch(topic: str, queue_id: int, records: Iterable[Mapping[str, object]],
                 sys_flag: int = 0) -> bytes:
    """A whole batch from ``BatchBuilder.add`` keyword dicts (tests and tools; the SDK's
    producer adds records as messages arrive)."""
    builder = BatchBuilder(topic, queue_id, sys_flag)
    for rec in records:
        builder.add(**rec)  # type: ignore[arg-type]
    return builder.finish()


append_record_py = append_record  # the reference (tests run it beside the compiled twin)
if core is not None:  # the compiled twin (_crecords.pyx), falling back on the reference
    core.use_writer(append_record_py)
    append_record = core.append_record
