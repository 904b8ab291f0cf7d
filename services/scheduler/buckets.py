"""Time buckets on disk: per bucket, an index of its timers and the marks of what became of them.

A bucket covers ``width_ms`` of due times (an hour by default, as in QMQ); a timer already due
when it arrives goes to the bucket of "now". Files under ``buckets/``, named by the bucket's
start (epoch ms, 20 digits)::

    {start}.idx    index entries, in log order (derived: rebuilt from the timer log)
        0   due_ms      i64
        8   pos         i64   position in the timer log
        16  size        u32   entry size in the timer log
        20  id_hash     u32   CRC32 of the message id (cancel looks a timer up by it)
        24  topic_hash  u32   CRC32 of the real topic (pending counts per topic)
    {start}.done   marks (truth, fsynced before anyone relies on them)
        0   pos         i64
        8   state       u8    Mark

An index file is never fsynced per write: the checkpoint records its size after an fsync, and
recovery cuts it back to that size and re-derives the rest from the timer log. A bucket's files
are deleted together once it has ended and every timer in it is final.
"""

from __future__ import annotations

import logging
import os
import resource
import struct
import zlib
from collections.abc import Iterator
from enum import IntEnum
from pathlib import Path

from tidemq_server.common.files import FdPool

log = logging.getLogger(__name__)

ENTRY = struct.Struct(">qqIII")
ENTRY_SIZE = ENTRY.size  # 28
MARK = struct.Struct(">qB")
MARK_SIZE = MARK.size  # 9
MAX_OPEN = 4096  # index files kept open at once (30 days of hour buckets is 720)


class Mark(IntEnum):
    INTENT = 1  # delivery started: if no final mark follows, the broker is asked first
    DELIVERED = 2  # stored in its real topic (final)
    CANCELLED = 3  # cancelled before delivery (final)
    SKIPPED = 4  # unreadable in the timer log: never delivered (final, logged)
    ROLLED = 5  # superseded by a newer copy rolled into the intake topic (final)


FINAL = frozenset({Mark.DELIVERED, Mark.CANCELLED, Mark.SKIPPED, Mark.ROLLED})


def text_hash(text: str) -> int:
    return zlib.crc32(text.encode("utf-8"))


def read_marks(data: bytes) -> dict[int, Mark]:
    """Position → its latest mark (a final mark is never followed by another)."""
    marks: dict[int, Mark] = {}
    usable = len(data) - len(data) % MARK_SIZE
    for pos, state in MARK.iter_unpack(data[:usable]):
        if state in (1, 2, 3, 4, 5) and marks.get(pos) not in FINAL:
            marks[pos] = Mark(state)
    return marks


class BucketFiles:
    def __init__(self, directory: Path, width_ms: int) -> None:
        self.dir = directory
        self.width_ms = width_ms
        self.sizes: dict[int, int] = {}  # bucket start → index file size (bytes)
        self._dirty: set[int] = set()  # buckets written since the last sync
        self._closed_dirty: set[int] = set()  # ... whose file was closed since (LRU)
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        self._fds = FdPool(self._index_path, max_open=max(16, min(MAX_OPEN, soft // 4)),
                           on_evict=self._evicted)  # open index files, LRU

    def bucket_of(self, ms: int) -> int:
        return ms - ms % self.width_ms

    def _path(self, bucket: int, suffix: str) -> Path:
        return self.dir / f"{bucket:020d}.{suffix}"

    def _index_path(self, bucket: int) -> Path:
        return self._path(bucket, "idx")

    # --- opening and recovery -------------------------------------------------------------
    def open(self, checkpointed: dict[int, int]) -> None:
        """Cut each index back to its checkpointed size (none: empty); recovery re-derives
        the rest from the timer log."""
        self.dir.mkdir(parents=True, exist_ok=True)
        for path in self.dir.iterdir():
            stem, _, suffix = path.name.partition(".")
            if suffix != "idx" or not stem.isdigit():
                continue
            bucket = int(stem)
            keep = checkpointed.get(bucket, 0)
            size = path.stat().st_size
            if size > keep:
                os.truncate(path, keep)
            self.sizes[bucket] = min(size, keep)

    def known(self) -> list[int]:
        """Every bucket with an index or marks file, ascending."""
        found = set(self.sizes)
        for path in self.dir.iterdir():
            stem, _, suffix = path.name.partition(".")
            if suffix == "done" and stem.isdigit():
                found.add(int(stem))
        return sorted(found)

    # --- index --------------------------------------------------------------------------------
    def _evicted(self, bucket: int) -> None:
        if bucket in self._dirty:  # synced by the next checkpoint, through a new fd
            self._dirty.discard(bucket)
            self._closed_dirty.add(bucket)

    def append(self, bucket: int, entries: bytes) -> None:
        """Add index entries (not synced: see ``sync``)."""
        at = self.sizes.get(bucket, 0)
        os.pwrite(self._fds.open(bucket), entries, at)
        self.sizes[bucket] = at + len(entries)
        self._dirty.add(bucket)

    def take_unsynced(self) -> tuple[list[int], list[Path]]:
        """What ``sync`` must make durable: duplicated fds of written index files (so an LRU
        close meanwhile cannot pull them away) and paths of those already closed. Call it on
        the event loop; pass the result to ``sync`` (which may run in a thread)."""
        dirty, self._dirty = self._dirty, set()
        closed, self._closed_dirty = self._closed_dirty, set()
        fds = []
        for bucket in dirty:
            fd = self._fds.get(bucket)
            if fd is None:
                closed.add(bucket)
            else:
                fds.append(os.dup(fd))
        return fds, [self._path(b, "idx") for b in closed]

    @staticmethod
    def sync(fds: list[int], paths: list[Path]) -> None:
        """fsync index files written since the last ``take_unsynced``."""
        try:
            for fd in fds:
                os.fdatasync(fd)
        finally:
            for fd in fds:
                os.close(fd)
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue  # retired meanwhile
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)

    def read_index(self, bucket: int, size: int | None = None) -> bytes:
        limit = self.sizes.get(bucket, 0) if size is None else size
        if not limit:
            return b""
        with open(self._path(bucket, "idx"), "rb") as f:
            return f.read(limit)

    def iter_index(self, bucket: int, size: int, chunk: int = 256
                   ) -> Iterator[tuple[int, int, int, int, int]]:
        """Index entries of ``bucket`` up to ``size`` bytes, read ``chunk`` entries at a time
        (a caller that stops early reads little)."""
        with open(self._path(bucket, "idx"), "rb", buffering=0) as f:
            at = 0
            while at < size:
                data = f.read(min(chunk * ENTRY_SIZE, size - at))
                if not data:
                    return
                at += len(data)
                yield from ENTRY.iter_unpack(data[:len(data) - len(data) % ENTRY_SIZE])

    # --- marks --------------------------------------------------------------------------------
    def add_marks(self, bucket: int, marks: bytes) -> None:
        """Append marks and fsync them (blocking: run it off the event loop when large)."""
        fd = os.open(self._path(bucket, "done"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, marks)
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def read_marks(self, bucket: int) -> dict[int, Mark]:
        try:
            data = self._path(bucket, "done").read_bytes()
        except FileNotFoundError:
            return {}
        return read_marks(data)

    # --- retirement ---------------------------------------------------------------------------
    def retire(self, bucket: int) -> None:
        """Delete a finished bucket's files."""
        self._fds.close(bucket)
        self._dirty.discard(bucket)
        self._closed_dirty.discard(bucket)
        self.sizes.pop(bucket, None)
        self._path(bucket, "idx").unlink(missing_ok=True)
        self._path(bucket, "done").unlink(missing_ok=True)

    def disk_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.dir.iterdir() if p.is_file())

    def close(self) -> None:
        self._fds.close_all()
