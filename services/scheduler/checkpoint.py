"""The scheduler's checkpoint: how far its derived files are durable, written atomically.

``indexed_end``: every timer-log entry below it has its bucket index entry inside the recorded
index sizes (``buckets``), which were fsynced before the checkpoint was written; recovery cuts
each index back to its size and re-derives entries from ``indexed_end`` on.
``ingested_next``: the next broker intake offset not in the timer log yet (as of that moment).
``segments``: for each timer-log segment, the latest bucket any of its entries is filed under.
``rebuild_end``: a store rebuilt from the broker's intake topic (an empty or lost disk) re-reads
intake up to this offset; below it a timer may have been delivered by the lost store already.
``strict_below``: timer-log entries below this position were filed by a rebuild: each is
delivered ``strict`` (the broker stores it only if that delivery is not stored yet). While
``ingested_next < rebuild_end`` every entry is such. Both 0 for a store never rebuilt.
``ages``: ``[wall time (s), timer-log end then]`` marks, oldest first: how old an entry is, for
the timer roll (services/scheduler/rolls.py), across restarts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import orjson

from tidemq_server.common.files import write_atomic

VERSION = 1


@dataclass(slots=True)
class Checkpoint:
    indexed_end: int = 0
    ingested_next: int = 0
    buckets: dict[int, int] = field(default_factory=dict)  # bucket start → index file size
    segments: dict[int, int] = field(default_factory=dict)  # segment start → latest bucket
    rebuild_end: int = 0  # intake offset a rebuild re-reads up to
    strict_below: int = 0  # timer-log position: rebuilt entries below it
    ages: list[tuple[float, int]] = field(default_factory=list)  # (wall s, log end then)

    @classmethod
    def load(cls, path: Path) -> Checkpoint | None:
        try:
            data = orjson.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        if data.get("version") != VERSION:
            raise ValueError(f"{path}: checkpoint version {data.get('version')} is not "
                             f"{VERSION}")
        return cls(indexed_end=int(data["indexed_end"]),
                   ingested_next=int(data["ingested_next"]),
                   buckets={int(k): int(v) for k, v in data["buckets"].items()},
                   segments={int(k): int(v) for k, v in data["segments"].items()},
                   rebuild_end=int(data.get("rebuild_end", 0)),
                   strict_below=int(data.get("strict_below", 0)),
                   ages=[(float(t), int(p)) for t, p in data.get("ages", [])])

    def save(self, path: Path) -> None:
        """Atomically (``write_atomic``): the old or the new one, never torn."""
        data = orjson.dumps({
            "version": VERSION, "indexed_end": self.indexed_end,
            "ingested_next": self.ingested_next,
            "buckets": {str(k): v for k, v in self.buckets.items()},
            "segments": {str(k): v for k, v in self.segments.items()},
            "rebuild_end": self.rebuild_end, "strict_below": self.strict_below,
            "ages": self.ages,
        })
        write_atomic(path, data)
