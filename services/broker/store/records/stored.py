"""Stored-form reads: the records a pull selects, served as the log holds them.

``stored_groups`` turns consume-queue spots ``(offset, size)`` into a stored-form answer blob
(``tidemq.protocol.records.stored``: per batch touched, its header as stored then the selected
records as stored). Neighbouring records share one ``pread`` (as ``MessageStore.read_many``),
a batch's header is taken from the bytes already read when the span holds it (else read once
per call), and nothing is decoded beyond what the checks need:

- each record's CRC is checked (a record that fails is logged and left out: a corrupt record
  is never served), and it must point back at its batch (``batch_pos``);
- exact tags: when the pull names tags, the record's tag bytes are compared with them (the
  consume queue's tag code already filtered; this rules out a code collision);
- a version-1 record is decoded and served as a one-record group (``entry.as_group``).
"""

from __future__ import annotations

import logging
import struct
import zlib

from tidemq.protocol.records.stored import GROUP
from tidemq.protocol.records.v2 import CRC_AT, CRC_FROM, HEADER_FIXED, PLACE_AT, RECORD_FIXED
from tidemq.protocol.records.v2_read import BatchError, read_head

from tidemq_server.broker.store.records import v1 as record
from tidemq_server.broker.store.records.entry import ReadBytes, as_group, read_head_of

log = logging.getLogger(__name__)

COALESCE_GAP = 64 * 1024  # reads of records closer than this share one pread
MAX_SPAN = 4 * 1024 * 1024  # ... as long as the span stays below this
_LENS = struct.Struct(">HH")  # a record's id_len, tag_len
_LENS_AT = 55
_CRC = struct.Struct(">I")
_V1_MAGIC = record.MAGIC.to_bytes(4, "big")


def spans(spots: list[tuple[int, int]], segment_bytes: int) -> list[tuple[int, int, int]]:
    """``(start, end, j)``: spots ``[i, j)`` read as one span ``[start, end)`` (i: the previous
    span's j), neighbours within ``COALESCE_GAP`` in one segment, each span below MAX_SPAN."""
    out = []
    i = 0
    while i < len(spots):
        start, size = spots[i]
        end, j = start + size, i + 1
        while j < len(spots):
            nxt, nsize = spots[j]
            if (nxt - end > COALESCE_GAP or nxt + nsize - start > MAX_SPAN
                    or nxt // segment_bytes != start // segment_bytes or nxt < end):
                break
            end, j = nxt + nsize, j + 1
        out.append((start, end, j))
        i = j
    return out


def stored_groups(read_bytes: ReadBytes, spots: list[tuple[int, int]], segment_bytes: int,
                  tags: frozenset[bytes] | None = None) -> tuple[bytes, int]:
    """The stored-form blob of the records at ``spots`` (ascending) and how many it holds."""
    out = bytearray()
    count = 0
    heads: dict[int, bytes] = {}  # batch offset -> its header as stored
    batch = -1  # the batch of the open group (-1: none)
    group_at = group_n = 0
    crc32 = zlib.crc32
    i = 0
    for start, end, j in spans(spots, segment_bytes):
        buf = read_bytes(start, end - start)
        view = memoryview(buf)
        for phys, size in spots[i:j]:
            p = phys - start
            if len(buf) < p + size or size < RECORD_FIXED:
                log.error("refusing to serve record at %d: beyond the log's end", phys)
                continue
            if buf[p + 4:p + 8] == _V1_MAGIC:  # a version 1 record (a v2 one has batch_pos)
                try:
                    rec = record.decode(buf, p, phys)
                except (record.CorruptRecord, UnicodeDecodeError, ValueError) as exc:
                    log.error("refusing to serve record at %d: %s", phys, exc)
                    continue
                if tags is not None and (rec.tag or "").encode("utf-8") not in tags:
                    continue
                if batch >= 0:
                    GROUP.pack_into(out, group_at, group_n)
                    batch = -1
                out += as_group(rec)
                count += 1
                continue
            if crc32(view[p + CRC_FROM:p + size], crc32(view[p + PLACE_AT:p + CRC_AT])) != \
                    _CRC.unpack_from(buf, p + CRC_AT)[0]:
                log.error("refusing to serve record at %d: its CRC does not match", phys)
                continue
            if tags is not None:
                id_len, tag_len = _LENS.unpack_from(buf, p + _LENS_AT)
                t = p + RECORD_FIXED + id_len
                if bytes(view[t:t + tag_len]) not in tags:
                    continue
            at = phys - int.from_bytes(buf[p + 4:p + 8], "big")
            if at != batch:
                head = heads.get(at)
                if head is None:
                    head = _head(read_bytes, buf, start, at, phys)
                    if head is None:
                        continue
                    heads[at] = head
                if batch >= 0:
                    GROUP.pack_into(out, group_at, group_n)
                batch, group_at, group_n = at, len(out), 0
                out += b"\0\0\0\0"
                out += head
            out += view[p:p + size]
            group_n += 1
            count += 1
        i = j
    if batch >= 0:
        GROUP.pack_into(out, group_at, group_n)
    return bytes(out), count


def _head(read_bytes: ReadBytes, buf: bytes, start: int, at: int, phys: int) -> bytes | None:
    """The header of the batch at ``at`` as stored (checked), from ``buf`` (which starts at log
    offset ``start``) when it holds it; None (logged) when it is not a sound header."""
    try:
        if at >= start and len(buf) - (at - start) >= HEADER_FIXED:
            h = read_head(buf, at - start, whole=False)
            if h.base_physical != at:
                raise BatchError("base_physical", f"says {h.base_physical}")
            return buf[at - start:at - start + h.records_at]
        h = read_head_of(read_bytes, phys, phys - at)
        return read_bytes(at, h.records_at)
    except (BatchError, record.CorruptRecord) as exc:
        log.error("refusing to serve record at %d: its batch header: %s", phys, exc)
        return None
