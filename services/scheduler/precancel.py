"""Cancels that arrive before the scheduler has taken the timer in from the broker.

A cancel names the timer's topic and intake offset; when that offset is not ingested yet, the
(topic, message id) is kept here (appended to ``precancel.log`` and fsynced before the cancel is
answered) and the timer is filed as cancelled the moment it is ingested. Entries are dropped at a
checkpoint once their offset is behind the checkpointed intake position.

A scheduler rebuilding its timer log adds every (topic, id) the broker's
``TIDE_SYS_TIMER_CANCELS`` topic holds with ``add_rebuilt``: such a cancel holds for *any*
intake copy of that id in that topic (the original and its rolled copies) below the intake
offset where the rebuild ends, and is dropped once the store has taken in that far. It is
stored as ``-(end + 1)``.

Ids are unique per topic only: one id may wait in several topics, and a cancel of one never
holds for another. A cancel without a topic (``None``: written before cancels named one, or
a cancel record of an old broker) holds for the id in any topic. Record layout (big-endian)::

    0  intake offset  i64 (negative: a rebuild cancel, see above)
    8  id length      u16 (bit 15 set: the topic follows; clear: no topic)
    10 topic length   u8   \\ only with bit 15
    11 topic          utf-8 /
    .. message id     utf-8
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from tidemq_server.common.files import write_atomic

HEAD = struct.Struct(">qH")
TOPIC_LEN = struct.Struct(">B")
HAS_TOPIC = 0x8000  # flag in the id length: a topic follows the head

Key = tuple[str | None, str]  # (topic, message id); topic None: any topic


class Precancels:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.by_id: dict[Key, int] = {}  # (topic, message id) → intake offset
        self.below: dict[Key, int] = {}  # (topic, message id) → rebuild end: any copy below it
        self._stale = False  # the file holds cancels no longer needed

    def load(self) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        at = 0
        while at + HEAD.size <= len(data):
            offset, n = HEAD.unpack_from(data, at)
            at += HEAD.size
            topic: str | None = None
            if n & HAS_TOPIC:
                if at + TOPIC_LEN.size > len(data):
                    break  # torn tail
                (tn,) = TOPIC_LEN.unpack_from(data, at)
                at += TOPIC_LEN.size
                if at + tn > len(data):
                    break
                topic = data[at:at + tn].decode("utf-8", "replace")
                at += tn
                n &= ~HAS_TOPIC
            if at + n > len(data):
                break  # torn tail
            mid = data[at:at + n].decode("utf-8", "replace")
            at += n
            if offset < 0:
                self.below[(topic, mid)] = -offset - 1
            else:
                self.by_id[(topic, mid)] = offset
        self._stale = True

    @staticmethod
    def _encode(key: Key, offset: int) -> bytes:
        topic, mid = key
        raw = mid.encode("utf-8")
        if topic is None:
            return HEAD.pack(offset, len(raw)) + raw
        name = topic.encode("utf-8")
        return HEAD.pack(offset, len(raw) | HAS_TOPIC) + TOPIC_LEN.pack(len(name)) + name + raw

    def add(self, topic: str | None, mid: str, offset: int) -> None:
        """Durably remember a cancel (blocking: one small write and an fsync)."""
        self.by_id[(topic, mid)] = offset
        self._append(self._encode((topic, mid), offset))

    def add_rebuilt(self, cancels: list[Key], end: int) -> None:
        """Durably remember cancels read back from the broker by a rebuild (one write and
        one fsync): every copy of these (topic, id) below intake offset ``end`` is
        cancelled."""
        if not cancels:
            return
        for key in cancels:
            self.below[key] = end
        self._append(b"".join(self._encode(k, -end - 1) for k in cancels))

    def _append(self, data: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, data)
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def _below(self, topic: str, mid: str, offset: int) -> bool:
        return any(end is not None and offset < end
                   for end in (self.below.get((topic, mid)), self.below.get((None, mid))))

    def _exact(self, topic: str, mid: str, offset: int) -> Key | None:
        for key in ((topic, mid), (None, mid)):
            if self.by_id.get(key) == offset:
                return key
        return None

    def holds(self, topic: str, mid: str, offset: int) -> bool:
        """Whether the timer of ``topic`` at ``offset`` was cancelled early (without
        forgetting it)."""
        return self._below(topic, mid, offset) or self._exact(topic, mid, offset) is not None

    def take(self, topic: str, mid: str, offset: int) -> bool:
        """True (and forgotten in memory) when the timer of ``topic`` at ``offset`` was
        cancelled early."""
        if self._below(topic, mid, offset):
            return True  # kept: a rolled copy of the same id may follow
        key = self._exact(topic, mid, offset)
        if key is not None:
            del self.by_id[key]
            self._stale = True
            return True
        return False

    def prune(self, ingested_before: int) -> None:
        """Rewrite the file without cancels of offsets already ingested and checkpointed."""
        keep = {k: o for k, o in self.by_id.items() if o >= ingested_before}
        if len(keep) != len(self.by_id):
            self.by_id, self._stale = keep, True
        below = {k: e for k, e in self.below.items() if e > ingested_before}
        if len(below) != len(self.below):
            self.below, self._stale = below, True
        if not self._stale:
            return
        self._stale = False
        write_atomic(self.path, b"".join(
            [self._encode(k, o) for k, o in keep.items()]
            + [self._encode(k, -e - 1) for k, e in below.items()]))
