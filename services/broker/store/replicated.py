"""The store's side of replication: raw log chunks out, raw log chunks in, truncation.

Kept apart from the writer: a replica never calls ``put`` (its gate refuses), so these run on
the event loop between the writer's batches and never interleave with one.

- ``read_chunk``: whole entries (v1 records, v2 batches: both start with their size and a
  tidemq magic) and a segment's closing blank from a physical offset, within one segment, at
  most ``max_bytes`` (the first entry whole even when larger);
- ``append_chunk``: a primary's chunk written at the same offset: every entry's CRCs and
  offset checked first (``entry.validate_entry``), then one write, then the same dispatch
  recovery uses (a v2 batch from its summary); a blank seals the segment exactly as the
  primary's did, so segment boundaries and every offset match. The first chunk drops the
  index's recent-key filter (keyfilter.py): only a primary's dedup checks ask it, and fed by a
  replica it costs ~4 % of the replica's CPU for as long as it follows; a promoted replica's
  checks read the index for their window instead (``Ingest._needs_index``), as without it;
- ``truncate``: cut the log, consume queues and checkpoint back to an offset (index entries
  past the cut stay: every index lookup reads and verifies the record it points to).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tidemq.protocol.records.v2_read import BatchSummary

from tidemq_server.broker.store.records import v1 as record
from tidemq_server.broker.store.records.entry import validate_entry
from tidemq_server.broker.store.records.v1 import BLANK_SIZE, CorruptRecord

if TYPE_CHECKING:
    from tidemq_server.broker.store.store import MessageStore

log = logging.getLogger(__name__)


class ChunkError(Exception):
    """A replicated chunk that cannot be written here (wrong offset, corrupt, misaligned)."""


def read_chunk(store: MessageStore, offset: int, max_bytes: int) -> bytes:
    """Whole records from ``offset`` (a record boundary or segment start below the log end)."""
    clog = store.log
    end = clog.write_offset
    if offset >= end:
        return b""
    i = clog._segment_index(offset)
    if i is None:
        raise ChunkError(f"offset {offset} is below the log start {clog.min_offset}")
    seg = clog.segments[i]
    seg_end = min(seg.start + seg.length, end)
    if offset >= seg_end:  # past a sealed segment's data: the next segment
        raise ChunkError(f"offset {offset} is not a record boundary (segment {seg.name} ends "
                         f"at {seg_end})")
    want = min(seg_end - offset, max_bytes)
    # at least a record prefix: enough to see a blank or the first record's size and magic
    buf = clog.read_bytes(offset, max(want, min(record.PREFIX.size, seg_end - offset)))
    view = memoryview(buf)
    p = 0
    while p < len(view):
        if record.is_blank(view, p):
            p += BLANK_SIZE
            break
        if len(view) - p < 4:
            break
        size = int.from_bytes(view[p:p + 4], "big")
        if p == 0 and (len(view) < record.PREFIX.size or record.PREFIX.unpack_from(view, 0)[1]
                       & 0xFFFF_0000 != record.MAGIC_BASE):
            raise ChunkError(f"offset {offset} is not a record boundary")
        if size < record.MIN_RECORD_SIZE:
            raise ChunkError(f"no record at offset {offset + p} (size {size})")
        if p + size > len(view):
            if p == 0:  # one record larger than max_bytes: send it whole
                return clog.read_bytes(offset, size)
            break
        p += size
    view.release()
    return buf if p == len(buf) else buf[:p]  # whole records only: usually all that was read


def append_chunk(store: MessageStore, data: bytes, at_offset: int) -> int:
    """Write ``data`` (from ``read_chunk`` on the primary) at ``at_offset``, which must be this
    log's end; dispatch its records. Returns how many records it held (a batch's all)."""
    clog = store.log
    if at_offset != clog.write_offset:
        raise ChunkError(f"chunk for offset {at_offset}, but this log ends at "
                         f"{clog.write_offset}")
    if store.index.filter is not None:
        store.stop_tracking_recent_keys()
    view = memoryview(data)
    seg = clog.segments[-1]
    metas: list[record.RecordMeta | BatchSummary] = []  # in log order: v1 records, v2 batches
    p = 0
    sealed = False
    while p < len(view):
        phys = at_offset + p
        if record.is_blank(view, p):
            if p + BLANK_SIZE != len(view):
                raise ChunkError(f"bytes after the segment's closing blank at {phys}")
            sealed = True
            break
        try:
            summary = validate_entry(view, p, phys)
            metas.append(record.decode_meta(view, p, phys) if summary is None else summary)
            size = int.from_bytes(view[p:p + 4], "big")
        except (CorruptRecord, UnicodeDecodeError, ValueError) as exc:
            raise ChunkError(f"corrupt record at {phys}: {exc}") from exc
        if phys - seg.start + size + BLANK_SIZE > clog.segment_bytes:
            raise ChunkError(f"record at {phys} crosses its segment's end (segment size "
                             "differs from the primary's?)")
        p += size
    if p:
        clog.write(data[:p] if p < len(data) else data)
    if sealed:
        clog.roll()
    disp = store.dispatcher
    n = 0
    for m in metas:
        if isinstance(m, BatchSummary):  # a v2 batch, shipped as the primary stored it
            disp.dispatch_batch(m)
            n += m.head.count
            continue
        disp.dispatch(m.topic, m.queue_id, m.queue_offset, m.physical_offset, m.size,
                      m.sys_flag, m.tag_code, m.store_timestamp, m.unique_key, m.keys)
        n += 1
    touched = disp.write_pending()
    if touched:
        store._notify(touched)
    return n


def truncate(store: MessageStore, offset: int) -> int:
    """Cut everything at and after ``offset`` (a record boundary): log, consume queues,
    checkpoint. Returns the bytes removed."""
    clog = store.log
    if offset >= clog.write_offset:
        return 0
    if offset < clog.min_offset:
        raise ChunkError(f"cannot truncate to {offset}, below the log start {clog.min_offset}")
    removed = clog.write_offset - offset
    store.dispatcher.write_pending()
    store.dispatcher.truncate_from(offset)
    clog.truncate(offset)
    store._save_checkpoint(offset)
    log.warning("replication: truncated %d bytes of commit log (and its consume queues) back "
                "to offset %d", removed, offset)
    return removed
