"""The commit log: fixed-size segment files named by their 20-digit start offset.

Only the store's single writer appends; reads are positional (``os.pread``) and may run at any
time. A record never spans segments: when one does not fit, the segment gets an 8-byte blank
marker and the record starts the next segment. Segment files are not preallocated, so a file's
length is where its data ends.

Invariants:
- ``write_offset`` is always a record boundary (or a segment start).
- Every byte below ``write_offset`` has been handed to the OS; ``synced_offset`` ≤ it has been
  fsynced.
- Nothing below ``min_offset`` is readable; segments are deleted whole, oldest first.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path

from tidemq.protocol.records.v2 import RECORD_FIXED
from tidemq.protocol.records.v2_read import BatchSummary

from tidemq_server.broker.store.records import entry
from tidemq_server.broker.store.records import v1 as record
from tidemq_server.broker.store.records.entry import read_record, salvage_batch, validate_entry
from tidemq_server.broker.store.records.v1 import BLANK, BLANK_MAGIC, BLANK_SIZE, CorruptRecord
from tidemq_server.broker.store.types import StoredRecord
from tidemq_server.common.files import fsync_dir

log = logging.getLogger(__name__)

CLOSED = "closed"  # ``error`` of a log closed cleanly (not a failure)

SCAN_CHUNK = 8 * 1024 * 1024  # bytes read at a time by recovery scans (a larger entry: whole)


class StoreClosedError(Exception):
    """The commit log is closed or in a sticky error state; nothing more is written."""


@dataclass(slots=True)
class Segment:
    start: int
    path: Path
    fd: int
    length: int  # bytes written to the file

    @property
    def name(self) -> str:
        return self.path.name


def segment_name(start: int) -> str:
    return f"{start:020d}"


class CommitLog:
    def __init__(self, directory: Path, segment_bytes: int) -> None:
        if segment_bytes < 4096:
            raise ValueError("segment_bytes must be at least 4096")
        self.dir = directory
        self.segment_bytes = segment_bytes
        self.segments: list[Segment] = []
        self.write_offset = 0
        self.synced_offset = 0
        self._dirty: set[int] = set()  # fds written since the last sync
        self.error: str | None = None  # sticky: once set, every write refuses

    # --- opening and recovery ------------------------------------------------------------
    def open(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        names = sorted(p for p in self.dir.iterdir() if p.name.isdigit() and len(p.name) == 20)
        for path in names:
            start = int(path.name)
            if start % self.segment_bytes:
                raise CorruptRecord(start, f"segment {path.name} is not aligned to "
                                    f"{self.segment_bytes} bytes (segment size changed?)")
            fd = os.open(path, os.O_RDWR)
            self.segments.append(Segment(start, path, fd, os.fstat(fd).st_size))
        if not self.segments:
            self._new_segment(0)
        last = self.segments[-1]
        self.write_offset = last.start + last.length
        self.synced_offset = self.write_offset

    @property
    def min_offset(self) -> int:
        return self.segments[0].start

    def scan(self, start: int) -> Iterator[tuple[memoryview, int, int, BatchSummary | None]]:
        """Yield ``(buffer, pos, physical_offset, summary)`` for each valid entry from ``start``
        on: a v1 record (summary None) or a v2 batch (its summary, for dispatch).

        In the last segment it stops at the first invalid entry or at the end of data;
        ``self.scan_end`` then holds the offset just past the last valid entry (where the log
        must be truncated: a torn tail). In a sealed segment (one with a successor) damage
        is not a torn tail and the entries after it are not thrown away: a corrupt entry
        whose size still leads to the next entry is skipped alone, otherwise the rest of that
        segment is; each skip is logged with the segment and offset and listed in
        ``self.skipped`` as ``(offset, bytes)``. Skipped entries are never served (every read
        checks the CRC); another copy of the log still has them.
        """
        self.scan_end = start
        self.skipped: list[tuple[int, int]] = []
        # where each entry holding skipped bytes starts: a record boundary, where a copy that
        # can fetch them again from another cuts its log (replication/recopy.py)
        self.damaged_at: list[int] = []
        i = self._segment_index(start)
        if i is None:
            return
        pos = start - self.segments[i].start
        while i < len(self.segments):
            seg = self.segments[i]
            sealed_by_successor = i + 1 < len(self.segments)
            result = yield from self._scan_segment(seg, pos, sealed_by_successor)
            if result is not None and not sealed_by_successor:
                return  # the last segment: the valid data ends at scan_end
            i += 1
            pos = 0
            if i < len(self.segments):
                self.scan_end = self.segments[i].start

    def _scan_segment(self, seg: Segment, pos: int, sealed: bool
                      ) -> Generator[tuple[memoryview, int, int, BatchSummary | None], None,
                                     str | None]:
        """The entries of one segment from ``pos``; returns None at its end (data end or
        blank), else why it stopped (a damaged entry the caller decides about)."""
        want = SCAN_CHUNK
        while pos < seg.length:
            view = memoryview(os.pread(seg.fd, min(want, seg.length - pos), pos))
            want = SCAN_CHUNK
            p = 0
            while True:
                if record.is_blank(view, p):
                    return None
                if len(view) - p < record.PREFIX.size:
                    if pos + p + record.PREFIX.size > seg.length:
                        return self._damaged(seg, pos + p, "a torn header", sealed)
                    break
                size = int.from_bytes(view[p:p + 4], "big")
                if size < record.MIN_RECORD_SIZE or size > self.segment_bytes:
                    return self._damaged(seg, pos + p, f"bad size {size}", sealed)
                if p + size > len(view):
                    if pos + p + size > seg.length:
                        return self._damaged(seg, pos + p, "torn at the end of the file",
                                             sealed)
                    if p == 0:
                        want = size  # an entry larger than a chunk: read it whole
                    break  # the entry continues in the next chunk
                try:
                    summary = validate_entry(view, p, seg.start + pos + p)
                except CorruptRecord as exc:
                    if not sealed or not self._next_is_record(seg, pos + p + size):
                        return self._damaged(seg, pos + p, exc.why, sealed)
                    kept = salvage_batch(view, p, seg.start + pos + p)
                    if kept is not None:  # a batch whose header holds: its sound records
                        self._salvaged(seg, kept[1], exc.why)
                        self.damaged_at.append(seg.start + pos + p)
                        yield view, p, seg.start + pos + p, kept[0]
                        p += size
                        self.scan_end = seg.start + pos + p
                        continue
                    what = {entry.V1: "record", entry.V2: "batch"}.get(
                        entry.kind_at(view, p) or 0, "entry")
                    log.error("recovery: corrupt %s in sealed segment %s at offset %d "
                              "(%s): skipped, never served", what, seg.name,
                              seg.start + pos + p, exc.why)
                    self.skipped.append((seg.start + pos + p, size))
                    self.damaged_at.append(seg.start + pos + p)
                    p += size
                    self.scan_end = seg.start + pos + p
                    continue
                yield view, p, seg.start + pos + p, summary
                p += size
                self.scan_end = seg.start + pos + p
            if p == 0 and want == SCAN_CHUNK:
                return self._damaged(seg, pos, "no entry fits", sealed)
            pos += p
        return None

    def _salvaged(self, seg: Segment, damaged: list[tuple[int, int]], why: str) -> None:
        if not damaged:
            log.error("recovery: batch in sealed segment %s failed validation (%s) but every "
                      "record's CRC holds: kept", seg.name, why)
        for at, n in damaged:
            log.error("recovery: corrupt record in sealed segment %s at offset %d, %d bytes "
                      "(its batch: %s): skipped, never served; the batch's other records are "
                      "kept", seg.name, at, n, why)
        self.skipped.extend(damaged)

    def _next_is_record(self, seg: Segment, at: int) -> bool:
        """Whether a record (or the closing blank) starts at ``at`` of ``seg``."""
        head = os.pread(seg.fd, record.PREFIX.size, at)
        if record.is_blank(head + bytes(BLANK_SIZE), 0):
            return True
        return (len(head) == record.PREFIX.size
                and record.PREFIX.unpack(head)[1] & 0xFFFF_0000 == record.MAGIC_BASE)

    def _damaged(self, seg: Segment, at: int, why: str, sealed: bool) -> str:
        """A stop inside ``seg`` at relative ``at``: in a sealed segment its rest is skipped
        (logged, listed); in the last one it is where the valid data ends."""
        if sealed:
            log.error("recovery: segment %s is damaged at offset %d (%s): its remaining %d "
                      "bytes are skipped, never served; the segments after it are kept",
                      seg.name, seg.start + at, why, seg.length - at)
            self.skipped.append((seg.start + at, seg.length - at))
            self.damaged_at.append(seg.start + at)
        return why

    def truncate(self, offset: int) -> None:
        """Drop everything at and after ``offset`` (recovery of a torn tail)."""
        while len(self.segments) > 1 and self.segments[-1].start > offset:
            seg = self.segments.pop()
            self._dirty.discard(seg.fd)
            os.close(seg.fd)
            seg.path.unlink()
            log.warning("recovery: removed segment %s past the valid end %d", seg.name, offset)
        seg = self.segments[-1]
        keep = offset - seg.start
        if not 0 <= keep <= self.segment_bytes:
            raise CorruptRecord(offset, "truncate outside the remaining segments")
        if keep < seg.length:
            log.warning("recovery: truncated %d bytes of torn tail at offset %d",
                        seg.length - keep, offset)
            os.ftruncate(seg.fd, keep)
            os.fsync(seg.fd)
            seg.length = keep
        self.write_offset = offset
        self.synced_offset = min(self.synced_offset, offset)

    # --- writing ---------------------------------------------------------------------------
    def fits(self, size: int) -> bool:
        """Whether a record of ``size`` fits in the current segment (leaving room for a blank)."""
        seg = self.segments[-1]
        return seg.length + size + BLANK_SIZE <= self.segment_bytes

    def roll(self) -> None:
        """Seal the current segment with a blank marker and start the next one."""
        seg = self.segments[-1]
        remaining = self.segment_bytes - seg.length
        os.pwrite(seg.fd, BLANK.pack(remaining, BLANK_MAGIC), seg.length)
        seg.length += BLANK_SIZE
        self._dirty.add(seg.fd)
        self._new_segment(seg.start + self.segment_bytes)
        self.write_offset = self.segments[-1].start

    def fail(self, reason: str) -> None:
        """Stop the log for good: every later write refuses with ``reason`` (the writer's
        sticky error after a failed batch or fsync)."""
        self.error = reason

    def write(self, data: bytes | bytearray) -> None:
        """Append ``data`` (whole records) to the current segment."""
        if self.error:
            raise StoreClosedError(self.error)
        seg = self.segments[-1]
        try:
            written = os.pwrite(seg.fd, data, seg.length)
            if written != len(data):
                raise OSError(f"short write: {written} of {len(data)} bytes")
        except OSError as exc:
            self.error = f"commit log write failed: {exc}"
            log.error("%s; the store refuses further writes", self.error)
            raise StoreClosedError(self.error) from exc
        seg.length += len(data)
        self.write_offset += len(data)
        self._dirty.add(seg.fd)

    def take_dirty(self) -> tuple[int, list[int]]:
        """For a flush: the offset that syncing the returned fds will make durable."""
        dirty = list(self._dirty)
        self._dirty.clear()
        return self.write_offset, dirty

    def mark_synced(self, offset: int) -> None:
        self.synced_offset = max(self.synced_offset, offset)

    def _new_segment(self, start: int) -> None:
        path = self.dir / segment_name(start)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self.segments.append(Segment(start, path, fd, os.fstat(fd).st_size))
        fsync_dir(self.dir)

    # --- reading ---------------------------------------------------------------------------
    def _segment_index(self, offset: int) -> int | None:
        if not self.segments or offset < self.segments[0].start:
            return None
        i = (offset - self.segments[0].start) // self.segment_bytes
        if i < len(self.segments) and self.segments[i].start <= offset:
            return int(i)
        return None

    def read_bytes(self, offset: int, size: int) -> bytes:
        """Raw bytes of ``[offset, offset + size)``, which must lie in one segment."""
        i = self._segment_index(offset)
        if i is None or offset + size > self.write_offset:
            return b""
        seg = self.segments[i]
        return os.pread(seg.fd, size, offset - seg.start)

    def read(self, offset: int, size: int | None = None) -> StoredRecord | None:
        """The CRC-checked record of either format at ``offset``, or None when absent or
        corrupt (a v2 record's topic, queue and times come from its batch's header)."""
        if offset < self.min_offset or offset >= self.write_offset:
            return None
        if size is None:
            head = self.read_bytes(offset, 4)
            if len(head) < 4:
                return None
            size = int.from_bytes(head, "big")
            if size < RECORD_FIXED or size > self.segment_bytes:
                return None
        try:
            return read_record(self.read_bytes, offset, size)
        except (CorruptRecord, UnicodeDecodeError, ValueError) as exc:
            log.error("refusing to serve record at %d: %s", offset, exc)
            return None

    def store_timestamp(self, offset: int) -> int | None:
        """The store time of the record at ``offset`` (either format), without decoding it."""
        return entry.store_timestamp(self.read_bytes, offset)

    # --- retention -------------------------------------------------------------------------
    def delete_oldest(self) -> Segment | None:
        """Remove the oldest segment (never the one being written)."""
        if len(self.segments) < 2:
            return None
        seg = self.segments.pop(0)
        self._dirty.discard(seg.fd)
        os.close(seg.fd)
        seg.path.unlink(missing_ok=True)
        return seg

    def close(self) -> None:
        for seg in self.segments:
            try:
                os.close(seg.fd)
            except OSError:
                pass
        self.segments.clear()
        self.error = self.error or CLOSED
