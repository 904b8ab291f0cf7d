"""Reading record format version 2 (layout in ``batch``): validation, summaries, records.

Pure functions over a buffer, no I/O:

- ``split`` cuts a request body into its batches (a body may hold several);
- ``validate`` validates one batch and returns its ``BatchSummary``: everything dispatch needs
  (positions, sizes, tag codes, message ids, keys) without copying a body. A client's batch is
  checked ``strict``ly (names, widths, limits, reserved properties, delays); a stored one
  (recovery, replication) is checked for integrity and for the offset it must live at;
- ``decode_record`` decodes one record whole; ``as_messages`` a request's every record, as the
  messages a test double of the broker reads.

Every failure is a ``BatchError`` (a ``ProtocolError``: 400, or 413 for a limit) whose message
names the record index and the field: ``records[3].crc: ...`` or ``batch.magic: ...``.
Nothing else escapes, whatever the bytes (the fuzz tests hold this).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

from tidemq.protocol.codes import ErrorCode, ProtocolError
from tidemq.protocol.message import DEFAULT_LIMITS, Limits, OutgoingMessage, has_forbidden
from tidemq.protocol.properties import SHARDING_KEY, is_reserved, reserved_text
from tidemq.protocol.records._compiled import core
from tidemq.protocol.records.v2 import (
    BROKER_AT,
    CRC_AT,
    CRC_FROM,
    FORMAT_VERSION,
    HEADER,
    HEADER_FIXED,
    KEY_SEPARATOR,
    MAGIC_BASE,
    MAGIC_HIGH,
    PLACE_AT,
    RECORD,
    RECORD_FIXED,
    DelayKind,
    decode_properties,
)
from tidemq.protocol.tags import TAG_MAX, tag_problem

Buffer = bytes | bytearray | memoryview

_DELAY_KINDS = frozenset(int(k) for k in DelayKind)


class BatchError(ProtocolError):
    """A batch that fails validation: ``index`` is the record (None: the batch header)."""

    def __init__(self, field_name: str, why: str, index: int | None = None,
                 code: ErrorCode = ErrorCode.BAD_REQUEST, batch: int | None = None) -> None:
        where = "batch" if index is None else f"records[{index}]"
        if batch is not None:
            where = f"batches[{batch}].{where}"
        super().__init__(code, f"{where}.{field_name}: {why}")
        self.index = index
        self.field = field_name
        self.why = why


@dataclass(slots=True)
class BatchHead:
    """A batch header (``batch`` layout), its head CRC checked."""

    size: int
    base_physical: int
    base_queue_offset: int
    store_timestamp: int
    store_host: bytes
    born_host: bytes
    count: int
    queue_id: int
    sys_flag: int
    topic: str
    records_at: int  # from the batch's first byte


@dataclass(slots=True)
class BatchSummary:
    """What dispatch and dedup need from a batch; positions are from the batch's first byte.

    Record i lives at ``head.base_physical + positions[i]`` with ``sizes[i]`` bytes and, when
    the batch is dispatched, queue offset ``head.base_queue_offset + i``.
    """

    head: BatchHead
    positions: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    tag_codes: list[int] = field(default_factory=list)
    message_ids: list[str] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)  # joined by KEY_SEPARATOR; "" for none
    delayed: list[int] = field(default_factory=list)  # indices of records with a delay
    payload_bytes: int = 0  # bodies + properties (the API's batch size bound)


@dataclass(slots=True)
class DecodedRecord:
    """One v2 record, decoded whole."""

    size: int
    ordinal: int
    message_id: str
    tag: str | None
    keys: list[str]
    properties: dict[str, str]
    body: bytes
    flag: int
    reconsume_times: int
    born_timestamp: int
    tag_code: int
    prepared_tx_offset: int
    delay_kind: int
    delay_value: int


def record_crc(view: memoryview, p: int, size: int) -> int:
    """The CRC the record at ``view[p:p + size]`` should carry."""
    return zlib.crc32(view[p + CRC_FROM:p + size], zlib.crc32(view[p + PLACE_AT:p + CRC_AT]))


def version_at(buf: Buffer, at: int) -> int | None:
    """The format version of the magic at ``buf[at + 4:]``; None when it is not one."""
    if len(buf) - at < 8:
        return None
    magic = int.from_bytes(buf[at + 4:at + 8], "big")
    return magic & 0xFFFF if magic & MAGIC_HIGH == MAGIC_BASE else None


def split(buf: Buffer) -> list[tuple[int, int]]:
    """``(start, size)`` of each batch of a request body; BatchError when the body is not
    whole batches (a batch cut short, or bytes after the last)."""
    out: list[tuple[int, int]] = []
    at, end = 0, len(buf)
    if not end:
        raise BatchError("total_size", "the body holds no batch")
    while at < end:
        if end - at < HEADER_FIXED:
            raise BatchError("total_size", f"{end - at} bytes left: a batch header needs "
                             f"{HEADER_FIXED}", batch=len(out))
        size = int.from_bytes(buf[at:at + 4], "big")
        if size < HEADER_FIXED or size > end - at:
            raise BatchError("total_size", f"{size} bytes, but {end - at} remain in the body "
                             "(a batch cut short?)", batch=len(out))
        out.append((at, size))
        at += size
    return out


def read_head(buf: Buffer, at: int = 0, end: int | None = None, *,
              whole: bool = True) -> BatchHead:
    """The header of the batch at ``buf[at:]``, its version, size and head CRC checked;
    ``whole``: the batch's records must be in the buffer too (else only its header)."""
    end = len(buf) if end is None else end
    if end - at < HEADER_FIXED:
        raise BatchError("total_size", f"{end - at} bytes: a batch header needs {HEADER_FIXED}")
    (size, magic, head_crc, base_phys, base_q, store_ts, store_host, born_host, attributes,
     count, queue_id, sys_flag, topic_len) = HEADER.unpack_from(buf, at)
    if magic & MAGIC_HIGH != MAGIC_BASE:
        raise BatchError("magic", f"{magic:#010x} is not a tidemq batch")
    if magic & 0xFFFF != FORMAT_VERSION:
        raise BatchError("magic", f"unknown format version {magic & 0xFFFF} (this reader "
                         f"takes batches of version {FORMAT_VERSION})")
    records_at = HEADER_FIXED + topic_len
    if size < records_at or records_at > end - at or (whole and size > end - at):
        raise BatchError("total_size", f"{size} bytes, but {end - at} are there and the header "
                         f"needs {records_at}")
    view = memoryview(buf)
    if zlib.crc32(view[at + BROKER_AT:at + records_at], zlib.crc32(view[at:at + 8])) != head_crc:
        raise BatchError("head_crc", "the header's CRC does not match its bytes")
    if attributes:
        raise BatchError("attributes", f"{attributes:#06x}: no attribute is defined (0)")
    if not count:
        raise BatchError("count", "a batch holds at least one record")
    try:
        topic = str(view[at + HEADER_FIXED:at + records_at], "utf-8")
    except UnicodeDecodeError:
        raise BatchError("topic", "is not utf-8") from None
    return BatchHead(size, base_phys, base_q, store_ts, bytes(store_host), bytes(born_host),
                     count, queue_id, sys_flag, topic, records_at)


def validate(buf: Buffer, at: int = 0, *, strict: bool = True, offset: int | None = None,
          allowed: frozenset[str] = frozenset(), limits: Limits = DEFAULT_LIMITS,
          end: int | None = None) -> BatchSummary:
    """Validate the batch at ``buf[at:]`` (its records' CRCs included) and summarize it.

    ``strict`` (a client's batch) also checks ids, tags, keys, properties (none of the
    reserved names except ``allowed``), delays and ``limits``; ``offset`` (a stored batch)
    is where the batch must say it lives.
    """
    head = read_head(buf, at, end)
    if offset is not None and head.base_physical != offset:
        raise BatchError("base_physical", f"the batch says it lives at {head.base_physical}, "
                         f"read at {offset}")
    if strict and head.count > limits.max_batch_messages:
        raise BatchError("count", f"{head.count} records exceeds the batch limit of "
                         f"{limits.max_batch_messages}", code=ErrorCode.MESSAGE_TOO_LARGE)
    summary = BatchSummary(head)
    positions, sizes, codes = summary.positions, summary.sizes, summary.tag_codes
    ids, keys, delayed = summary.message_ids, summary.keys, summary.delayed
    view = memoryview(buf)
    crc32 = zlib.crc32
    max_body, max_id = limits.max_body_bytes, limits.max_message_id_chars
    p, stop = at + head.records_at, at + head.size
    payload = 0
    for i in range(head.count):
        if stop - p < RECORD_FIXED:
            raise BatchError("size", f"{stop - p} bytes left in the batch: a record needs at "
                             f"least {RECORD_FIXED} (truncated record)", i)
        (size, pos, ordinal, crc, _, _, _, code, _, _, kind, id_len, tag_len, keys_len,
         props_len, body_len) = RECORD.unpack_from(buf, p)
        if size > stop - p or size < RECORD_FIXED:
            raise BatchError("size", f"{size} bytes, but {stop - p} remain in the batch "
                             "(truncated record)", i)
        var_at = p + RECORD_FIXED
        if var_at + id_len + tag_len + keys_len + props_len + body_len != p + size:
            raise BatchError("body_len", f"the field lengths (id {id_len}, tag {tag_len}, keys "
                             f"{keys_len}, properties {props_len}, body {body_len}) overrun or "
                             f"disagree with the record size {size}", i)
        if pos != p - at:
            raise BatchError("batch_pos", f"says {pos}, the record is at {p - at}", i)
        if ordinal != i:
            raise BatchError("ordinal", f"says {ordinal}, the record is number {i}", i)
        if crc32(view[p + CRC_FROM:p + size], crc32(view[p + PLACE_AT:p + CRC_AT])) != crc:
            raise BatchError("crc", "the record's CRC does not match its bytes", i)
        tag_at = var_at + id_len
        keys_at = tag_at + tag_len
        try:
            mid = str(view[var_at:tag_at], "utf-8")
            key = str(view[keys_at:keys_at + keys_len], "utf-8") if keys_len else ""
        except UnicodeDecodeError:
            raise BatchError("message_id" if keys_len == 0 else "keys", "is not utf-8",
                             i) from None
        if strict:
            if (tag_len or code or keys_len or props_len or body_len > max_body
                    or not 0 < len(mid) <= max_id or not mid.isalnum()):
                _strict(view, i, tag_at, keys_at, mid, code, key, props_len, body_len, limits,
                        allowed)  # the common record (an id, a body in its limit) skips this
            payload += body_len + props_len
        if kind:
            delayed.append(i)
        positions.append(p - at)
        sizes.append(size)
        codes.append(code)
        ids.append(mid)
        keys.append(key)
        p += size
    if p != stop:
        raise BatchError("total_size", f"{stop - p} bytes after the last of {head.count} "
                         "records")
    if strict and payload > limits.max_batch_bytes:
        raise BatchError("total_size", f"batch of {payload} bytes (bodies and properties) "
                         f"exceeds the limit of {limits.max_batch_bytes} bytes",
                         code=ErrorCode.MESSAGE_TOO_LARGE)
    summary.payload_bytes = payload
    if strict and delayed:
        for i in delayed:
            _validate_delay(buf, at + positions[i], i, limits)
    return summary


def _strict(view: memoryview, i: int, tag_at: int, keys_at: int, mid: str, code: int, key: str,
            props_len: int, body_len: int, limits: Limits, allowed: frozenset[str]) -> None:
    """A client record's names, widths and limits (``validate``'s strict part)."""
    if not mid or len(mid) > limits.max_message_id_chars:
        raise BatchError("message_id", f"{len(mid)} characters; 1-"
                         f"{limits.max_message_id_chars} allowed", i)
    if not mid.isalnum() and has_forbidden(mid):
        raise BatchError("message_id", "must not contain control characters \\x00 \\x01 "
                         "\\x02 \\x1f", i)
    tag_len = keys_at - tag_at
    if tag_len:
        try:
            tag = str(view[tag_at:keys_at], "utf-8")
        except UnicodeDecodeError:
            raise BatchError("tag", "is not utf-8", i) from None
        if len(tag) > TAG_MAX or has_forbidden(tag):
            raise BatchError("tag", f"at most {TAG_MAX} characters, no control characters", i)
        if not tag.isalnum() and (problem := tag_problem(tag)):  # no expression selects it
            raise BatchError("tag", f"{tag!r} {problem}", i)
        if code != zlib.crc32(view[tag_at:keys_at]) + 1:
            raise BatchError("tag_code", f"{code} is not the tag's code (crc32 of the tag + 1)",
                             i)
    elif code:
        raise BatchError("tag_code", f"{code} for a record without a tag (0)", i)
    if key:
        for k in key.split(KEY_SEPARATOR):
            if not k or len(k) > 1024 or has_forbidden(k):
                raise BatchError("keys", "each key 1-1024 characters, no control characters",
                                 i)
    if body_len > limits.max_body_bytes:
        raise BatchError("body", f"{body_len} bytes exceeds the limit of "
                         f"{limits.max_body_bytes} bytes", i, ErrorCode.MESSAGE_TOO_LARGE)
    if props_len:
        if props_len > limits.max_properties_bytes:
            raise BatchError("properties", f"{props_len} bytes exceeds the limit of "
                             f"{limits.max_properties_bytes} bytes", i,
                             ErrorCode.MESSAGE_TOO_LARGE)
        at = keys_at + len(key.encode("utf-8"))
        _validate_properties(view[at:at + props_len], i, allowed)


def _validate_properties(raw: memoryview, i: int, allowed: frozenset[str]) -> None:
    try:
        text = str(raw, "utf-8")
    except UnicodeDecodeError:
        raise BatchError("properties", "are not utf-8", i) from None
    if not text.endswith("\x02"):
        raise BatchError("properties", "must be name \\x01 value \\x02 pairs", i)
    for item in text[:-1].split("\x02"):
        name, sep, value = item.partition("\x01")
        if not name or not sep or "\x01" in value or has_forbidden(name + value):
            raise BatchError("properties", f"{item[:40]!r} is not name \\x01 value (non-empty "
                             "name, no control characters)", i)
        if name not in allowed and is_reserved(name):
            raise BatchError("properties", reserved_text(name), i)


def _validate_delay(buf: Buffer, p: int, i: int, limits: Limits) -> None:
    (_, _, _, _, _, _, _, _, _, value, kind, *_) = RECORD.unpack_from(buf, p)
    bad = ErrorCode.INVALID_DELAY
    if kind not in _DELAY_KINDS:
        raise BatchError("delay_kind", f"{kind} is not a delay kind (0-3)", i, bad)
    if kind == DelayKind.LEVEL and not 1 <= value <= limits.max_delay_level:
        raise BatchError("delay_value", f"level {value}: must be 1-{limits.max_delay_level}",
                         i, bad)
    if kind == DelayKind.DELAY_MS and not 0 <= value <= limits.max_delay_ms:
        raise BatchError("delay_value", f"{value} ms: must be 0-{limits.max_delay_ms} ms", i,
                         bad)
    if kind == DelayKind.DELIVER_AT_MS and value < 0:
        raise BatchError("delay_value", f"deliver_at_ms {value}: must be epoch ms >= 0", i, bad)


def decode_record(buf: Buffer, p: int, index: int | None = None,
                  verify: bool = True) -> DecodedRecord:
    """The record at ``buf[p:]`` whole (its CRC checked unless ``verify`` is off)."""
    if len(buf) - p < RECORD_FIXED:
        raise BatchError("size", "truncated record", index)
    (size, _, ordinal, crc, flag, reconsume, born, code, prepared, delay_value, kind, id_len,
     tag_len, keys_len, props_len, body_len) = RECORD.unpack_from(buf, p)
    if size < RECORD_FIXED or size > len(buf) - p or (
            RECORD_FIXED + id_len + tag_len + keys_len + props_len + body_len != size):
        raise BatchError("size", f"{size} bytes disagree with the buffer or the field lengths",
                         index)
    view = memoryview(buf)
    if verify and record_crc(view, p, size) != crc:
        raise BatchError("crc", "the record's CRC does not match its bytes", index)
    a = p + RECORD_FIXED
    b = a + id_len
    c = b + tag_len
    d = c + keys_len
    e = d + props_len
    try:
        raw_keys = str(view[c:d], "utf-8")
        return DecodedRecord(size, ordinal, str(view[a:b], "utf-8"),
                             str(view[b:c], "utf-8") if tag_len else None,
                             raw_keys.split(KEY_SEPARATOR) if raw_keys else [],
                             decode_properties(view[d:e]), bytes(view[e:p + size]), flag,
                             reconsume, born, code, prepared, kind, delay_value)
    except UnicodeDecodeError:
        raise BatchError("properties", "a text field is not utf-8", index) from None


def as_messages(buf: Buffer) -> list[OutgoingMessage]:
    """A send request's batches as the messages they carry, in record order: each with its
    batch's queue, its delay from the record's fields and the sharding key from its
    properties (what a test double of a broker reads; the broker itself never decodes this)."""
    out: list[OutgoingMessage] = []
    for at, size in split(buf):
        s = validate(buf, at, strict=False, end=at + size)
        for p in s.positions:
            rec = decode_record(buf, at + p)
            props = rec.properties
            kind, value = rec.delay_kind, rec.delay_value
            out.append(OutgoingMessage(
                rec.body, rec.message_id, rec.tag, rec.keys, props, s.head.queue_id,
                props.pop(SHARDING_KEY, None), value if kind == DelayKind.LEVEL else 0,
                value if kind == DelayKind.DELAY_MS else None,
                value if kind == DelayKind.DELIVER_AT_MS else None))
    return out


validate_py = validate  # the reference (tests run it beside the compiled twin)
if core is not None:  # the compiled twin (_crecords.pyx), falling back on the reference
    core.use_reader(validate_py, read_head, _strict, _validate_delay, BatchSummary,
                    DEFAULT_LIMITS, is_reserved, TAG_MAX)
    validate = core.validate
