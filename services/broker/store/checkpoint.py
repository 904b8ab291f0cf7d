"""Checkpoint: how far the commit log is durable and how far derived data is durable.

Written as a small JSON file through temp file + fsync + rename, so it is either the old or
the new version, never torn. Recovery trusts derived data (consume queues, index) only below
``dispatched``, and re-dispatches everything after it. The file carries a CRC32 of its fields
(``crc32``), so a flipped bit is found (``CorruptCheckpoint``) rather than trusted: a damaged
checkpoint could claim more was dispatched than was. A file without it (older versions) is
read as before.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tidemq_server.common.files import write_atomic


class CorruptCheckpoint(Exception):
    """The checkpoint file cannot be trusted (not JSON, or its CRC does not match)."""


def _crc(fields: dict[str, object]) -> int:
    return zlib.crc32(json.dumps(fields, sort_keys=True).encode())


@dataclass(slots=True)
class Checkpoint:
    commitlog_synced: int = 0  # commit log bytes below this offset are fsynced
    dispatched: int = 0  # consume queues and index are durable for records below this offset
    timestamp_ms: int = 0  # when this checkpoint was taken
    clean_shutdown: bool = False  # the store was closed, not killed
    retention_floors: dict[str, int] = field(default_factory=dict)  # owner → lowest offset

    @classmethod
    def load(cls, path: Path) -> Checkpoint:
        """The checkpoint in ``path`` (a fresh one when there is none); CorruptCheckpoint
        naming what is wrong when it cannot be trusted."""
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError:
            return cls()
        except ValueError as exc:  # UnicodeDecodeError too
            raise CorruptCheckpoint(f"{path} is not a checkpoint: {exc}") from None
        if not isinstance(data, dict):
            raise CorruptCheckpoint(f"{path} is not a checkpoint: {type(data).__name__}")
        crc = data.pop("crc32", None)
        if crc is not None and crc != _crc(data):
            raise CorruptCheckpoint(f"{path}: CRC mismatch (stored {crc}, computed "
                                    f"{_crc(data)})")
        fields = {f.name for f in dataclasses.fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in fields})
        except TypeError as exc:
            raise CorruptCheckpoint(f"{path}: {exc}") from None

    def save(self, path: Path) -> None:
        fields = asdict(self)
        write_atomic(path, json.dumps({**fields, "crc32": _crc(fields)}).encode())
