"""The epoch history: which leadership term wrote which part of the commit log.

A list of ``(epoch, start_offset)``, ascending in both, persisted as JSON through temp file +
fsync + rename (RocketMQ 5 controller's EpochFile). An epoch's records lie in
``[start_offset, next entry's start_offset)``; the last epoch's end is the log's end.

When a former primary (or any replica) starts following, it compares its history with the
primary's: the logs agree up to the end of the newest epoch both hold with the same start, and
no further than either copy's end in that epoch (``divergence_point``). Everything past that
point is truncated before fetching.
"""

from __future__ import annotations

import itertools
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from tidemq_server.common.files import write_atomic

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EpochEntry:
    epoch: int
    start_offset: int

    def to_wire(self) -> list[int]:
        return [self.epoch, self.start_offset]


def parse_entries(raw: object) -> list[EpochEntry]:
    """Entries from their wire form ``[[epoch, start], ...]``; ValueError when malformed."""
    if not isinstance(raw, list):
        raise ValueError("an epoch history is a list of [epoch, start_offset] pairs")
    out: list[EpochEntry] = []
    for item in raw:
        if (not isinstance(item, list | tuple) or len(item) != 2
                or not all(isinstance(v, int) and v >= 0 for v in item)):
            raise ValueError(f"bad epoch entry {item!r}: want [epoch, start_offset]")
        out.append(EpochEntry(int(item[0]), int(item[1])))
    for a, b in itertools.pairwise(out):
        if b.epoch <= a.epoch or b.start_offset < a.start_offset:
            raise ValueError(f"epoch history not ascending at {a} → {b}")
    return out


def end_of(entries: list[EpochEntry], epoch: int, log_end: int) -> int | None:
    """Where ``epoch``'s records end in a history whose log ends at ``log_end``; None when the
    history has no such epoch."""
    for i, e in enumerate(entries):
        if e.epoch == epoch:
            return entries[i + 1].start_offset if i + 1 < len(entries) else log_end
    return None


def divergence_point(mine: list[EpochEntry], my_end: int, theirs: list[EpochEntry],
                     their_end: int) -> int:
    """The offset up to which two logs hold the same records (where a follower truncates).

    The newest epoch present in both histories with the same start is the last common term;
    the logs agree up to the smaller of the two ends of that term. Without any common epoch,
    nothing is known to agree: 0. A copy without any history (never promoted, never followed)
    is taken to hold the other side's first term.
    """
    if not theirs:
        return min(my_end, their_end)
    if not mine:  # a copy that never learned a term holds the first term's records
        first = end_of(theirs, theirs[0].epoch, their_end)
        return min(my_end, first if first is not None else their_end)
    starts = {e.epoch: e.start_offset for e in theirs}
    for e in reversed(mine):
        if starts.get(e.epoch) == e.start_offset:
            a = end_of(mine, e.epoch, my_end)
            b = end_of(theirs, e.epoch, their_end)
            assert a is not None and b is not None
            return min(a, b)
    return 0


class EpochFile:
    """The persisted history of one broker's log (``epochs.json`` beside its store)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[EpochEntry] = []

    def load(self) -> None:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            self.entries = []
            return
        self.entries = parse_entries(raw.get("epochs", []))

    def save(self) -> None:
        write_atomic(self.path, json.dumps({"epochs": [e.to_wire() for e in self.entries]}))

    @property
    def last_epoch(self) -> int:
        return self.entries[-1].epoch if self.entries else 0

    def to_wire(self) -> list[list[int]]:
        return [e.to_wire() for e in self.entries]

    def begin(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` writes from ``start_offset`` on (a promotion). An epoch not
        newer than the last is refused; one starting where the last started replaces it (the
        last term wrote nothing)."""
        if self.entries and epoch <= self.entries[-1].epoch:
            raise ValueError(f"epoch {epoch} is not newer than {self.entries[-1].epoch}")
        while self.entries and self.entries[-1].start_offset >= start_offset:
            if self.entries[-1].start_offset > start_offset:
                raise ValueError(f"epoch {epoch} cannot start at {start_offset}, before "
                                 f"{self.entries[-1]}")
            self.entries.pop()
        self.entries.append(EpochEntry(epoch, start_offset))
        self.save()

    def truncate(self, offset: int) -> None:
        """Forget terms that start past ``offset`` (the log was cut there)."""
        kept = [e for e in self.entries if e.start_offset <= offset]
        if kept != self.entries:
            log.warning("epoch history cut at %d: dropped %s", offset,
                        [e for e in self.entries if e.start_offset > offset])
            self.entries = kept
            self.save()

    def adopt(self, theirs: list[EpochEntry], upto: int) -> bool:
        """Take the primary's history for the part of the log this copy holds (below or at
        ``upto``); True when it changed (and was saved)."""
        kept = [e for e in theirs if e.start_offset <= upto]
        if kept == self.entries:
            return False
        self.entries = kept
        self.save()
        return True
