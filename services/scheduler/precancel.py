"""Cancels that arrive before the scheduler has taken the timer in from the broker.

A cancel names the timer's intake offset; when that offset is not ingested yet, the message id
is kept here (appended to ``precancel.log`` and fsynced before the cancel is answered) and the
timer is filed as cancelled the moment it is ingested. Entries are dropped at a checkpoint once
their offset is behind the checkpointed intake position.

A scheduler rebuilding its timer log adds every id the broker's ``TIDE_SYS_TIMER_CANCELS``
topic holds with ``add_rebuilt``: such a cancel holds for *any* intake copy of the id (the
original and its rolled copies) below the intake offset where the rebuild ends, and is dropped
once the store has taken in that far. It is stored as ``-(end + 1)``. Record layout
(big-endian)::

    0  intake offset  i64 (negative: a rebuild cancel, see above)
    8  id length      u16
    10 message id     utf-8
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from services.common.files import write_atomic

HEAD = struct.Struct(">qH")


class Precancels:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.by_id: dict[str, int] = {}  # message id → intake offset
        self.below: dict[str, int] = {}  # message id → rebuild end: any copy below it
        self._stale = False  # the file holds cancels no longer needed

    def load(self) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        at = 0
        while at + HEAD.size <= len(data):
            offset, n = HEAD.unpack_from(data, at)
            if at + HEAD.size + n > len(data):
                break  # torn tail
            mid = data[at + HEAD.size: at + HEAD.size + n].decode("utf-8", "replace")
            if offset < 0:
                self.below[mid] = -offset - 1
            else:
                self.by_id[mid] = offset
            at += HEAD.size + n
        self._stale = True

    @staticmethod
    def _encode(mid: str, offset: int) -> bytes:
        raw = mid.encode("utf-8")
        return HEAD.pack(offset, len(raw)) + raw

    def add(self, mid: str, offset: int) -> None:
        """Durably remember a cancel (blocking: one small write and an fsync)."""
        self.by_id[mid] = offset
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, self._encode(mid, offset))
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def add_rebuilt(self, mids: list[str], end: int) -> None:
        """Durably remember cancels read back from the broker by a rebuild (one write and
        one fsync): every copy of these ids below intake offset ``end`` is cancelled."""
        if not mids:
            return
        for mid in mids:
            self.below[mid] = end
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, b"".join(self._encode(m, -end - 1) for m in mids))
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def holds(self, mid: str, offset: int) -> bool:
        """Whether the timer at ``offset`` was cancelled early (without forgetting it)."""
        end = self.below.get(mid)
        return (end is not None and offset < end) or self.by_id.get(mid) == offset

    def take(self, mid: str, offset: int) -> bool:
        """True (and forgotten in memory) when the timer at ``offset`` was cancelled early."""
        end = self.below.get(mid)
        if end is not None and offset < end:
            return True  # kept: a rolled copy of the same id may follow
        if self.by_id.get(mid) == offset:
            del self.by_id[mid]
            self._stale = True
            return True
        return False

    def prune(self, ingested_before: int) -> None:
        """Rewrite the file without cancels of offsets already ingested and checkpointed."""
        keep = {m: o for m, o in self.by_id.items() if o >= ingested_before}
        if len(keep) != len(self.by_id):
            self.by_id, self._stale = keep, True
        below = {m: e for m, e in self.below.items() if e > ingested_before}
        if len(below) != len(self.below):
            self.below, self._stale = below, True
        if not self._stale:
            return
        self._stale = False
        write_atomic(self.path, b"".join(
            [self._encode(m, o) for m, o in keep.items()]
            + [self._encode(m, -e - 1) for m, e in below.items()]))
