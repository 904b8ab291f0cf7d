"""Consume queue: per (topic, queue id), fixed 20-byte units pointing into the commit log.

Unit layout (big-endian)::

    0   commit log offset   i64
    8   size                i32   0 marks a hole (never served)
    12  tag slot            i64   tag hash, or delivery time (ms) for delay-level queues

Units live in files of ``units_per_file`` units named by the 20-digit logical offset of their
first unit, under ``consumequeue/{topic}/{queue_id}/``. A unit's position *is* its queue
offset, so writes are positional and re-dispatching a record after a crash is idempotent.
Derived data: rebuilt from the commit log by recovery, never trusted past the checkpoint.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from tidemq_server.broker.store.twin import cstore
from tidemq_server.common.files import FdPool

UNIT = struct.Struct(">qiq")
UNIT_SIZE = UNIT.size  # 20



def pack_units(base: int, positions: list[int], sizes: list[int], codes: list[int]) -> bytes:
    """The units of a batch's records: record i at ``base + positions[i]``, ``sizes[i]`` bytes,
    tag slot ``codes[i]`` (a ``BatchSummary``'s lists), back to back."""
    pack = UNIT.pack
    return b"".join([pack(base + p, size, code)
                     for p, size, code in zip(positions, sizes, codes, strict=True)])


pack_units_py = pack_units  # the reference (tests run it beside the compiled twin)
if cstore is not None:  # the compiled twin (_cstore.pyx), falling back on the reference
    cstore.use_units(pack_units_py)
    pack_units = cstore.pack_units


class ConsumeQueue:
    def __init__(self, directory: Path, topic: str, queue_id: int, units_per_file: int) -> None:
        self.dir = directory
        self.topic = topic
        self.queue_id = queue_id
        self.units_per_file = units_per_file
        self.file_bytes = units_per_file * UNIT_SIZE
        self._fds = FdPool(self._path)  # file start (logical) → fd
        self.min_offset = 0
        self.max_offset = 0  # next queue offset
        self._pending = bytearray()  # units appended since the last write_pending()
        self._pending_start = 0
        self.dirty: set[int] = set()

    def _path(self, start: int) -> Path:
        return self.dir / f"{start:020d}"

    # --- opening ---------------------------------------------------------------------------
    def load(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        starts = sorted(int(p.name) for p in self.dir.iterdir()
                        if p.name.isdigit() and len(p.name) == 20)
        for start in starts:
            self._fds.open(start, os.O_RDWR)
        if starts:
            self.min_offset = starts[0]
            last = starts[-1]
            size = os.fstat(self._fds[last]).st_size
            self.max_offset = last + size // UNIT_SIZE
            if size % UNIT_SIZE:  # torn unit at the tail
                os.ftruncate(self._fds[last], (size // UNIT_SIZE) * UNIT_SIZE)

    def _fd(self, start: int) -> int:
        fd = self._fds.get(start)
        if fd is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd = self._fds.open(start)
        return fd

    # --- writing ---------------------------------------------------------------------------
    def append(self, queue_offset: int, phys: int, size: int, tag: int) -> None:
        """Buffer one unit; ``write_pending`` puts buffered units into the files."""
        if not self._pending:
            self._pending_start = queue_offset
        elif self._pending_start + len(self._pending) // UNIT_SIZE != queue_offset:
            self.write_pending()
            self._pending_start = queue_offset
        self._pending += UNIT.pack(phys, size, tag)
        if queue_offset + 1 > self.max_offset:
            self.max_offset = queue_offset + 1

    def append_units(self, queue_offset: int, units: bytes) -> None:
        """``append`` for a run of packed units (``pack_units``) from ``queue_offset`` on."""
        if not self._pending:
            self._pending_start = queue_offset
        elif self._pending_start + len(self._pending) // UNIT_SIZE != queue_offset:
            self.write_pending()
            self._pending_start = queue_offset
        self._pending += units
        end = queue_offset + len(units) // UNIT_SIZE
        if end > self.max_offset:
            self.max_offset = end

    def write_pending(self) -> None:
        data = memoryview(self._pending)
        offset = self._pending_start
        while data:
            start = offset - offset % self.units_per_file
            room = (start + self.units_per_file - offset) * UNIT_SIZE
            piece = data[:room]
            fd = self._fd(start)
            os.pwrite(fd, piece, (offset - start) * UNIT_SIZE)
            self.dirty.add(fd)
            offset += len(piece) // UNIT_SIZE
            data = data[room:]
        self._pending = bytearray()

    def truncate_from_physical(self, phys: int) -> None:
        """Drop units whose commit log offset is ≥ ``phys`` (they will be re-dispatched)."""
        lo, hi = self.min_offset, self.max_offset
        while lo < hi:  # first unit with offset >= phys (units are sorted by offset)
            mid = (lo + hi) // 2
            unit = self.read_units(mid, 1)
            if unit and unit[0][1] != 0 and unit[0][0] < phys:
                lo = mid + 1
            else:
                hi = mid
        self.truncate_to(lo)

    def truncate_to(self, queue_offset: int) -> None:
        """Make ``queue_offset`` the next offset: files wholly past it go, one is cut."""
        queue_offset = max(queue_offset, self.min_offset)
        for start in sorted(self._fds, reverse=True):
            if start >= queue_offset:
                self._drop(start)
                continue
            keep = (queue_offset - start) * UNIT_SIZE
            if os.fstat(self._fds[start]).st_size > keep:
                os.ftruncate(self._fds[start], keep)
            break
        self.max_offset = queue_offset

    # --- reading ---------------------------------------------------------------------------
    def read_units(self, offset: int, count: int) -> list[tuple[int, int, int]]:
        """Up to ``count`` units from ``offset``: ``(commit log offset, size, tag slot)``."""
        count = min(count, self.max_offset - offset)
        out: list[tuple[int, int, int]] = []
        while count > 0:
            start = offset - offset % self.units_per_file
            fd = self._fds.get(start)
            if fd is None:
                break
            n = min(count, start + self.units_per_file - offset)
            raw = os.pread(fd, n * UNIT_SIZE, (offset - start) * UNIT_SIZE)
            out.extend(UNIT.iter_unpack(raw[: len(raw) - len(raw) % UNIT_SIZE]))
            got = len(raw) // UNIT_SIZE
            if got < n:
                break
            offset += n
            count -= n
        return out

    def last_physical(self) -> int | None:
        """Commit log offset of the last unit, if any."""
        units = self.read_units(self.max_offset - 1, 1) if self.max_offset else []
        return units[0][0] if units else None

    # --- retention -------------------------------------------------------------------------
    def advance_min(self, min_phys: int) -> None:
        """Move ``min_offset`` past units pointing below ``min_phys``; delete dead files."""
        lo, hi = self.min_offset, self.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            unit = self.read_units(mid, 1)
            if unit and unit[0][0] < min_phys:
                lo = mid + 1
            else:
                hi = mid
        self.min_offset = lo
        for start in sorted(self._fds):
            if start + self.units_per_file <= lo and start + self.units_per_file < self.max_offset:
                self._drop(start)

    def _drop(self, start: int) -> None:
        self.dirty.discard(self._fds[start])
        self._fds.remove(start)

    def take_dirty(self) -> list[int]:
        fds = list(self.dirty)
        self.dirty.clear()
        return fds

    def close(self) -> None:
        self._fds.close_all()
