"""Timer log: the scheduler's append-only log of every timer it accepted — its truth.

Segment files ``log/{start:020d}`` hold entries back to back; a position is global (segment
start + offset in the file) and never reused. A segment is deleted once every timer in it is
delivered or cancelled (``TimerStore`` decides). Entry layout (big-endian)::

    0   size      u32   the whole entry, header included
    4   magic     u32   format and version
    8   crc       u32   CRC32 of bytes 12..size
    12  due_ms    i64   delivery time (epoch ms)
    20  bucket    i64   start (ms) of the time bucket the timer is indexed under
    28  intake    i64   offset of the timer's record in the broker's intake queue (-1: none)
    36  payload         msgpack: the record to deliver (tidemq.protocol.DeliveryRow)

A batch is appended with one write and made durable with one fdatasync before anything else
refers to it. Recovery validates entries forward from the last checkpoint and truncates a torn
tail.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tidemq_server.common.files import FdPool, fsync_dir

log = logging.getLogger(__name__)

HEADER = struct.Struct(">IIIqqq")
HEADER_SIZE = HEADER.size  # 36
TAIL = struct.Struct(">qqq")  # the CRC-covered part of the header
MAGIC = 0x7D1E_7101  # "tide timer" v1
MAX_ENTRY = 256 * 1024 * 1024
SCAN_CHUNK = 8 * 1024 * 1024
crc32 = zlib.crc32


class CorruptEntry(Exception):
    """An entry whose size, magic or CRC does not check: never delivered."""


@dataclass(slots=True)
class Entry:
    pos: int
    size: int
    due_ms: int
    bucket: int
    intake: int
    payload: bytes


def encode(due_ms: int, bucket: int, intake: int, payload: bytes) -> bytes:
    tail = TAIL.pack(due_ms, bucket, intake)
    crc = crc32(payload, crc32(tail))
    return struct.pack(">III", HEADER_SIZE + len(payload), MAGIC, crc) + tail + payload


def decode(buf: bytes | memoryview, at: int, pos: int) -> Entry:
    if len(buf) - at < HEADER_SIZE:
        raise CorruptEntry(f"entry at {pos}: truncated header")
    size, magic, crc, due, bucket, intake = HEADER.unpack_from(buf, at)
    if magic != MAGIC or not HEADER_SIZE <= size <= MAX_ENTRY or at + size > len(buf):
        raise CorruptEntry(f"entry at {pos}: bad magic or size ({magic:#x}, {size})")
    view = memoryview(buf)
    if crc32(view[at + 12: at + size]) != crc:
        raise CorruptEntry(f"entry at {pos}: CRC mismatch")
    return Entry(pos, size, due, bucket, intake, bytes(view[at + HEADER_SIZE: at + size]))


class TimerLog:
    def __init__(self, directory: Path, segment_bytes: int) -> None:
        self.dir = directory
        self.segment_bytes = segment_bytes
        self.starts: list[int] = []  # segment starts, ascending
        self._fds = FdPool(self._path)  # segment start → fd (every segment stays open)
        self.write_offset = 0
        self._dir_unsynced = False  # a segment was created since the last sync

    def _path(self, start: int) -> Path:
        return self.dir / f"{start:020d}"

    # --- opening and recovery -------------------------------------------------------------
    def open(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.starts = sorted(int(p.name) for p in self.dir.iterdir()
                             if p.name.isdigit() and len(p.name) == 20)
        for start in self.starts:
            self._fds.open(start, os.O_RDWR)
        if self.starts:
            last = self.starts[-1]
            self.write_offset = last + os.fstat(self._fds[last]).st_size

    def scan(self, start: int) -> Iterator[Entry]:
        """Valid entries from ``start`` to the end; truncates the log at the first bad one."""
        i = self._segment(start)
        if i is None:
            return
        pos = start
        while i < len(self.starts):
            seg = self.starts[i]
            fd = self._fds[seg]
            end = seg + os.fstat(fd).st_size
            while pos < end:
                buf = os.pread(fd, min(SCAN_CHUNK, end - pos), pos - seg)
                at = 0
                while at + HEADER_SIZE <= len(buf):
                    (size,) = struct.unpack_from(">I", buf, at)
                    if at + size > len(buf) and HEADER_SIZE <= size <= MAX_ENTRY and \
                            pos + size <= end:
                        if at > 0:
                            break  # runs past this chunk: read again from its start
                        buf = os.pread(fd, size, pos - seg)  # one entry larger than a chunk
                    try:
                        entry = decode(buf, at, pos)
                    except CorruptEntry as exc:
                        self._truncate(pos, str(exc))
                        return
                    yield entry
                    at += entry.size
                    pos += entry.size
                if at == 0:  # not even one whole entry: a torn tail
                    self._truncate(pos, f"entry at {pos}: truncated")
                    return
            i += 1
            if i < len(self.starts):
                pos = self.starts[i]

    def _truncate(self, pos: int, why: str) -> None:
        log.warning("timer log: %s; truncating the log at %d (was %d)", why, pos,
                    self.write_offset)
        i = self._segment(pos)
        assert i is not None
        for seg in self.starts[i + 1:]:
            self._fds.remove(seg)
        self.starts = self.starts[: i + 1]
        seg = self.starts[i]
        os.ftruncate(self._fds[seg], pos - seg)
        os.fsync(self._fds[seg])
        self.write_offset = pos

    # --- writing ------------------------------------------------------------------------------
    def append(self, entries: list[bytes]) -> tuple[list[int], list[int]]:
        """Write ``entries`` (encoded) in order; their positions, and the fds to sync."""
        positions: list[int] = []
        touched: list[int] = []
        chunk: list[bytes] = []
        chunk_bytes = 0
        for data in entries:
            if self._must_roll(chunk_bytes, len(data)):
                if chunk:
                    touched.append(self._write(chunk))
                    chunk, chunk_bytes = [], 0
                self._roll()
            positions.append(self.write_offset + chunk_bytes)
            chunk.append(data)
            chunk_bytes += len(data)
        if chunk:
            touched.append(self._write(chunk))
        return positions, touched

    def sync(self, fds: list[int]) -> None:
        """Make appended entries durable (blocking: callers run it in a thread), and a segment
        created since the last sync with them. Calls do not overlap: the store appends one batch
        at a time and syncs it before the next."""
        if self._dir_unsynced:
            self._dir_unsynced = False
            fsync_dir(self.dir)
        for fd in set(fds):
            os.fdatasync(fd)

    def _must_roll(self, pending: int, size: int) -> bool:
        """Start a new segment before an entry of ``size`` (``pending`` bytes not written yet)?
        Never for an empty segment: an entry larger than a segment gets one of its own."""
        if not self.starts:
            return True
        used = self.write_offset - self.starts[-1] + pending
        return used > 0 and used + size > self.segment_bytes

    def _roll(self) -> None:
        """A new segment. The directory is fsynced by the ``sync`` of the batch that made it
        (off the event loop: a directory fsync waits for the file system's journal, seconds
        on a busy disk, and the first timer of a fresh store always creates a segment)."""
        start = self.write_offset
        self._fds.open(start, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        self.starts.append(start)
        self._dir_unsynced = True

    def _write(self, chunk: list[bytes]) -> int:
        fd = self._fds[self.starts[-1]]
        data = b"".join(chunk)
        written = os.pwrite(fd, data, self.write_offset - self.starts[-1])
        if written != len(data):
            raise OSError(f"timer log: short write ({written} of {len(data)} bytes)")
        self.write_offset += len(data)
        return fd

    # --- reading ------------------------------------------------------------------------------
    def _segment(self, pos: int) -> int | None:
        i = bisect.bisect_right(self.starts, pos) - 1
        return i if i >= 0 else None

    def read(self, pos: int, size: int) -> Entry:
        i = self._segment(pos)
        if i is None:
            raise CorruptEntry(f"entry at {pos}: no segment holds it")
        seg = self.starts[i]
        return decode(os.pread(self._fds[seg], size, pos - seg), 0, pos)

    def read_many(self, spots: list[tuple[int, int]], gap: int = 64 * 1024,
                  span: int = 4 * 1024 * 1024) -> list[Entry | CorruptEntry]:
        """Entries at ``(pos, size)`` spots, in the given order; near ones share one pread."""
        order = sorted(range(len(spots)), key=spots.__getitem__)
        out: list[Entry | CorruptEntry] = [CorruptEntry("unread")] * len(spots)
        j, n = 0, len(order)
        while j < n:
            first, size = spots[order[j]]
            i = self._segment(first)
            seg_end = self.segment_end(self.starts[i]) if i is not None else first
            end, k = first + size, j + 1
            while k < n:
                pos, size = spots[order[k]]
                if pos - end > gap or pos + size - first > span or pos >= seg_end:
                    break
                if pos + size > end:
                    end = pos + size
                k += 1
            buf = b"" if i is None else os.pread(self._fds[self.starts[i]], end - first,
                                                 first - self.starts[i])
            for m in order[j:k]:
                pos = spots[m][0]
                try:
                    out[m] = decode(buf, pos - first, pos)
                except CorruptEntry as exc:
                    out[m] = exc
            j = k
        return out

    # --- retention ----------------------------------------------------------------------------
    def delete_segment(self, start: int) -> None:
        """Delete a whole segment (never the one being written)."""
        if start == self.starts[-1]:
            return
        self.starts.remove(start)
        self._fds.remove(start)
        log.info("timer log: deleted segment %020d (every timer in it is done)", start)

    def segment_end(self, start: int) -> int:
        i = self.starts.index(start)
        return self.starts[i + 1] if i + 1 < len(self.starts) else self.write_offset

    def disk_bytes(self) -> int:
        return sum(os.fstat(fd).st_size for fd in self._fds.fds())

    def close(self) -> None:
        self._fds.close_all()
