"""Log entries of either format: a version-1 record (``record.py``) or a version-2 batch
(``tidemq.protocol.records.v2``), for the readers that will meet both in one commit log.

Pure functions over buffers; the caller does the reading:

- ``kind_at`` / ``validate_entry``: what starts at a position and whether it is whole (recovery
  scans and replication chunks walk the log entry by entry; both kinds start with their size),
  checked against the offset it must live at;
- ``stored_record`` / ``read_record`` / ``record_in``: a consume-queue or index pointer to a
  ``StoredRecord``, either version; a v2 record takes its topic, queue, queue offset, store
  time and hosts from its batch's header (``offset - batch_pos``), and its message id, tag
  and keys come back as the ``UNIQ_KEY``, ``TAGS`` and ``KEYS`` properties a v1 record keeps
  them in, so every reader of ``StoredRecord`` works unchanged;
- ``salvage_batch``: what recovery keeps of a damaged batch in a sealed segment (its sound
  records; the damaged ones become consume-queue holes);
- ``store_timestamp``: a record's store time without decoding it (``offset_for_time``);
- ``as_group``: a v1 record as a stored-form pull group (a one-record v2 batch, filled), so a
  stored-form pull can serve segments written before v2.

Failures are ``CorruptRecord`` (the store's error for bytes that fail validation).
"""

from __future__ import annotations

from collections.abc import Callable

from tidemq.protocol import KEYS, TAGS, UNIQ_KEY
from tidemq.protocol.records.stored import GROUP
from tidemq.protocol.records.v2 import (
    HEADER_FIXED,
    KEY_SEPARATOR,
    MAX_TOPIC_BYTES,
    BatchBuilder,
    fill,
)
from tidemq.protocol.records.v2_read import (
    BatchError,
    BatchHead,
    BatchSummary,
    Buffer,
    DecodedRecord,
    decode_record,
    read_head,
    validate,
    version_at,
)

from tidemq_server.broker.store.records import v1 as record
from tidemq_server.broker.store.records.v1 import CorruptRecord
from tidemq_server.broker.store.types import StoredRecord, tag_code

V1, V2 = 1, 2
#: Reads ``size`` bytes at a commit log offset (``CommitLog.read_bytes``): b"" when absent.
ReadBytes = Callable[[int, int], bytes]


def kind_at(buf: Buffer, pos: int) -> int | None:
    """What starts at ``buf[pos:]``: V1 (a v1 record), V2 (a v2 batch header), None (neither:
    a v2 record, a blank, or junk)."""
    version = version_at(buf, pos)
    return version if version in (V1, V2) else None


def validate_entry(buf: Buffer, pos: int, offset: int) -> BatchSummary | None:
    """Validate the entry at ``buf[pos:]``, which lives at commit log ``offset``: a v2 batch
    answers its summary (dispatch uses it), a v1 record None; CorruptRecord otherwise."""
    kind = kind_at(buf, pos)
    if kind == V1:
        record.validate(buf, pos, offset)
        return None
    if kind != V2:
        raise CorruptRecord(offset, "neither a record nor a batch starts here")
    try:
        return validate(buf, pos, strict=False, offset=offset)
    except BatchError as exc:
        raise CorruptRecord(offset, exc.message) from None


def salvage_batch(buf: Buffer, pos: int, offset: int
                  ) -> tuple[BatchSummary, list[tuple[int, int]]] | None:
    """A v2 batch at ``buf[pos:]`` (held whole, at commit log ``offset``) that failed
    validation, as recovery keeps it in a sealed segment: when its header is sound, a summary
    of every record in which a damaged one is a hole (size 0, no id, no keys: never served,
    never indexed) and the ``(offset, bytes)`` of each damaged stretch — one record whose CRC
    fails, or from a record whose sizes are damaged to the batch's end (the records after it
    cannot be found). None when the header is damaged: the whole batch goes."""
    if kind_at(buf, pos) != V2:
        return None
    try:
        head = read_head(buf, pos)
    except BatchError:
        return None
    if head.base_physical != offset:
        return None
    batch = memoryview(buf)[pos:pos + head.size]
    summary = BatchSummary(head)
    damaged: list[tuple[int, int]] = []
    p = head.records_at
    for i in range(head.count):
        if p >= head.size:  # in a stretch that runs to the batch's end
            _hole(summary, head.size)
            continue
        rec: DecodedRecord | None = None
        try:
            rec = decode_record(batch, p, i)
        except BatchError as exc:
            if exc.field != "size":  # its sizes hold: the record alone is damaged
                size = int.from_bytes(batch[p:p + 4], "big")
                damaged.append((offset + p, size))
                _hole(summary, p)
                p += size
                continue
        if rec is None or rec.ordinal != i or int.from_bytes(batch[p + 4:p + 8], "big") != p:
            damaged.append((offset + p, head.size - p))
            _hole(summary, p)
            p = head.size
            continue
        summary.positions.append(p)
        summary.sizes.append(rec.size)
        summary.tag_codes.append(rec.tag_code)
        summary.message_ids.append(rec.message_id)
        summary.keys.append(KEY_SEPARATOR.join(rec.keys))
        p += rec.size
    return summary, damaged


def _hole(summary: BatchSummary, p: int) -> None:
    summary.positions.append(p)
    summary.sizes.append(0)
    summary.tag_codes.append(0)
    summary.message_ids.append("")
    summary.keys.append("")


def store_properties(rec: DecodedRecord) -> dict[str, str]:
    """A v2 record's properties with its message id, tag and keys added as the ``UNIQ_KEY``,
    ``TAGS`` and ``KEYS`` properties a v1 record (and every ``StoredRecord`` reader) has."""
    props = rec.properties
    if rec.message_id:
        props[UNIQ_KEY] = rec.message_id
    if rec.tag is not None:
        props[TAGS] = rec.tag
    if rec.keys:
        props[KEYS] = KEY_SEPARATOR.join(rec.keys)
    return props


def stored_record(head: BatchHead, buf: Buffer, p: int, offset: int) -> StoredRecord:
    """The v2 record at ``buf[p:]`` (at commit log ``offset``) of the batch ``head``."""
    try:
        rec = decode_record(buf, p)
    except BatchError as exc:
        raise CorruptRecord(offset, exc.message) from None
    if head.base_physical + int.from_bytes(buf[p + 4:p + 8], "big") != offset:
        raise CorruptRecord(offset, "the record's batch_pos does not lead to its batch")
    props = store_properties(rec)
    return StoredRecord(
        physical_offset=offset, size=rec.size, topic=head.topic, queue_id=head.queue_id,
        queue_offset=head.base_queue_offset + rec.ordinal, body=rec.body, properties=props,
        flag=rec.flag, sys_flag=head.sys_flag, born_timestamp=rec.born_timestamp,
        born_host=record.decode_host(head.born_host), store_timestamp=head.store_timestamp,
        store_host=record.decode_host(head.store_host), reconsume_times=rec.reconsume_times,
        prepared_tx_offset=rec.prepared_tx_offset,
    )


def read_head_of(read_bytes: ReadBytes, offset: int, batch_pos: int) -> BatchHead:
    """The header of the batch the v2 record at ``offset`` belongs to."""
    start = offset - batch_pos
    raw = read_bytes(start, min(HEADER_FIXED + MAX_TOPIC_BYTES, batch_pos))
    try:
        head = read_head(raw, whole=False)
    except BatchError as exc:
        raise CorruptRecord(offset, f"its batch at {start}: {exc.message}") from None
    if head.base_physical != start or batch_pos >= head.size:
        raise CorruptRecord(offset, f"the batch at {start} does not hold this record")
    return head


def read_record(read_bytes: ReadBytes, offset: int, size: int,
                heads: dict[int, BatchHead] | None = None) -> StoredRecord:
    """The record of either version at ``offset`` (``size`` bytes, as a consume-queue unit
    says); ``heads`` caches batch headers by their offset across calls."""
    buf = read_bytes(offset, size)
    if len(buf) < 8 or len(buf) != size:
        raise CorruptRecord(offset, "beyond the log's end")
    return record_in(buf, 0, offset, read_bytes, heads)


def record_in(buf: Buffer, p: int, offset: int, read_bytes: ReadBytes,
              heads: dict[int, BatchHead] | None = None) -> StoredRecord:
    """The record of either version at ``buf[p:]``, which holds commit log ``offset`` whole
    (a span read for several records); a v2 record's header is read with ``read_bytes``
    unless ``heads`` (by batch offset) has it."""
    if kind_at(buf, p) == V1:
        return record.decode(buf, p, offset)
    batch_pos = int.from_bytes(buf[p + 4:p + 8], "big")
    start = offset - batch_pos
    head = heads.get(start) if heads is not None else None
    if head is None:
        head = read_head_of(read_bytes, offset, batch_pos)
        if heads is not None:
            heads[start] = head
    return stored_record(head, buf, p, offset)


def store_timestamp(read_bytes: ReadBytes, offset: int) -> int | None:
    """The store time of the record of either version at ``offset`` (a v2 record's is its
    batch's), without decoding it; None when it cannot be read."""
    lead = read_bytes(offset, 8)
    if len(lead) < 8:
        return None
    if kind_at(lead, 0) == V1:
        raw = read_bytes(offset + record.STORE_TS_AT, 8)
        return int.from_bytes(raw, "big", signed=True) if len(raw) == 8 else None
    try:
        return read_head_of(read_bytes, offset, int.from_bytes(lead[4:8], "big")).store_timestamp
    except CorruptRecord:
        return None


def as_group(rec: StoredRecord) -> bytes:
    """A v1 record as one stored-form pull group: a one-record v2 batch with the record's own
    queue offset, store time and hosts (``tidemq.protocol.records.stored`` decodes it as any
    other)."""
    props = {k: v for k, v in rec.properties.items() if k not in (UNIQ_KEY, TAGS, KEYS)}
    builder = BatchBuilder(rec.topic, rec.queue_id, rec.sys_flag)
    builder.add(rec.body, rec.message_id, tag=rec.tag, keys=rec.keys, properties=props,
                born_timestamp=rec.born_timestamp, flag=rec.flag,
                reconsume_times=rec.reconsume_times, prepared_tx_offset=rec.prepared_tx_offset,
                code=tag_code(rec.tag))
    batch = bytearray(builder.finish())
    fill(batch, 0, rec.physical_offset, rec.queue_offset, rec.store_timestamp,
         record.encode_host(rec.store_host), record.encode_host(rec.born_host))
    return GROUP.pack(1) + bytes(batch)
