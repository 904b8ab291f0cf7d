"""Checkpoint: how far the commit log is durable and how far derived data is durable.

Written as a small JSON file through temp file + fsync + rename, so it is either the old or
the new version, never torn. Recovery trusts derived data (consume queues, index) only below
``dispatched``, and re-dispatches everything after it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from services.common.files import write_atomic


@dataclass(slots=True)
class Checkpoint:
    commitlog_synced: int = 0  # commit log bytes below this offset are fsynced
    dispatched: int = 0  # consume queues and index are durable for records below this offset
    timestamp_ms: int = 0  # when this checkpoint was taken
    clean_shutdown: bool = False  # the store was closed, not killed
    retention_floors: dict[str, int] = field(default_factory=dict)  # owner → lowest offset

    @classmethod
    def load(cls, path: Path) -> Checkpoint:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return cls()
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})

    def save(self, path: Path) -> None:
        write_atomic(path, json.dumps(asdict(self)).encode())
