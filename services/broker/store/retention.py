"""Retention: delete the oldest commit log segments, and the derived data that pointed there.

A segment goes when it is older than ``file_reserved_hours`` (by its last write), or earlier
while disk usage is past the high-water mark — oldest first, never the segment being written,
and never one that reaches a system consumer's retention floor (the checker's and scheduler's
reported progress): their unconsumed records must outlive any age limit.

``DiskSpace`` is the one place that judges the disk full: the writer refuses appends
(DISK_FULL) while ``full``, which the checkpoint loop and every retention run refresh.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidemq_server.broker.store.store import MessageStore

log = logging.getLogger(__name__)


class DiskSpace:
    """How full the store's disk is; ``full`` past ``full_ratio``, or with less than
    ``min_free_bytes`` free (writes refused). The writer also asks ``short`` before each group
    commit, so a disk another process filled refuses the write whole, before any of it is
    written (a full disk once killed the broker: the mapped index took a SIGBUS)."""

    def __init__(self, root: Path, full_ratio: float, min_free_bytes: int = 0) -> None:
        self.root = root
        self.full_ratio = full_ratio
        self.min_free_bytes = min_free_bytes
        self.full = False

    def used_ratio(self) -> float:
        usage = shutil.disk_usage(self.root)
        return usage.used / usage.total

    def short(self, extra: int = 0) -> bool:
        """Whether the disk cannot take ``extra`` more bytes: past ``full_ratio``, or less than
        ``min_free_bytes`` would be left."""
        usage = shutil.disk_usage(self.root)
        return (usage.used / usage.total > self.full_ratio
                or usage.free - extra < self.min_free_bytes)

    def refresh(self) -> bool:
        """Measure again; True when the disk is full."""
        self.full = self.short()
        return self.full


class Retention:
    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self.deleted_segments = 0

    async def run_once(self, now: float | None = None) -> int:
        """Delete what may go; return the number of segments deleted."""
        store, cfg = self.store, self.store.config
        now = time.time() if now is None else now
        floor = min(store.floors.values()) if store.floors else None
        deleted = 0
        async with store._sync_lock:
            while len(store.log.segments) > 1:
                seg = store.log.segments[0]
                seg_end = store.log.segments[1].start
                if floor is not None and seg_end > floor:
                    break  # holds records a system consumer has not consumed yet
                mtime = seg.path.stat().st_mtime
                expired = now - mtime > cfg.file_reserved_hours * 3600
                pressure = store.disk.used_ratio() > cfg.disk_high_water_ratio
                if not (expired or pressure):
                    break
                store.log.delete_oldest()
                deleted += 1
                log.info("retention: deleted segment %s (%s)", seg.name,
                         "expired" if expired else "disk past high-water mark")
            if deleted:
                min_phys = store.log.min_offset
                for cq in store.dispatcher.queues.values():
                    cq.advance_min(min_phys)
                store.index.delete_before(min_phys)
        self.deleted_segments += deleted
        if store.disk.refresh():
            log.error("disk usage past %.0f%% (or less than %d bytes free) and nothing "
                      "deletable: refusing writes", cfg.disk_full_ratio * 100,
                      cfg.disk_min_free_bytes)
        await asyncio.sleep(0)
        return deleted
