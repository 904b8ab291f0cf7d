"""Store settings: one field per knob, with its unit and default."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from tidemq_server.broker.store.types import GiB, MiB


class FlushMode(StrEnum):
    ASYNC = "async"  # ack once written to the OS; fsync every flush_interval_ms
    SYNC = "sync"  # ack only after the fsync that covers the record (group commit)


@dataclass(frozen=True, slots=True)
class StoreConfig:
    root: Path  # store directory: commitlog/, consumequeue/, index/, checkpoint
    segment_bytes: int = 1 * GiB  # commit log segment file size
    cq_units_per_file: int = 300_000  # consume queue units (20 B each) per file
    index_slots: int = 1_000_000  # hash slots per index file
    index_entries: int = 4_000_000  # entries per index file
    flush: FlushMode = FlushMode.ASYNC
    flush_interval_ms: int = 500  # async mode: fsync period; also checkpoint period
    max_send_wait_ms: int = 200  # a put whose queue head waited longer is refused (BUSY)
    max_pending_bytes: int = 256 * MiB  # write queue bound; beyond it puts are refused (BUSY)
    file_reserved_hours: float = 72.0  # delete commit log segments older than this
    retention_interval_s: float = 10.0  # how often retention runs
    disk_high_water_ratio: float = 0.85  # past this disk usage, delete oldest segments early
    disk_full_ratio: float = 0.95  # past this with nothing deletable, refuse puts (DISK_FULL)
    # a write that would leave less free space than this is refused (DISK_FULL) before any
    # byte of it is written: room for consume queue and index growth and the checkpoint
    disk_min_free_bytes: int = 16 * MiB
    store_host: str = "127.0.0.1:10911"  # recorded in every record; part of offset ids
    max_read_bytes: int = 32 * MiB  # upper bound on bytes one get() returns
