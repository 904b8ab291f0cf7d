"""Offsets of the event topic as Spark keeps them, read limits, and how a batch is split.

A source offset is ``{"queues": {"<queue id>": <next queue offset>, ...}}``: one entry per
queue of ``TIDE_SYS_TRANS_EVENTS``, kept by Spark in its checkpoint (offset log), so a restarted
query resumes exactly where the last committed batch ended. Everything here is pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

QueueOffsets = dict[int, int]  # queue id → queue offset


def to_spark(offsets: Mapping[int, int]) -> dict[str, dict[str, int]]:
    """Queue offsets as a Spark source offset (JSON-friendly: string keys, sorted)."""
    return {"queues": {str(q): int(offsets[q]) for q in sorted(offsets)}}


def from_spark(offset: Mapping[str, object] | None) -> QueueOffsets:
    """A Spark source offset back to queue offsets (an empty or foreign dict → no queues)."""
    queues = (offset or {}).get("queues")
    if not isinstance(queues, dict):
        return {}
    return {int(q): int(v) for q, v in queues.items()}


def advance(start: Mapping[int, int], latest: Mapping[int, int],
            max_rows: int | None) -> QueueOffsets:
    """End offsets of the next batch: every queue up to ``latest``, or at most ``max_rows``
    events in all, shared fairly between the queues that have events (water-filling: a queue
    with fewer events than its share leaves the rest to the others)."""
    queues = sorted(set(start) | set(latest))
    begin = {q: start.get(q, 0) for q in queues}
    available = {q: max(0, latest.get(q, begin[q]) - begin[q]) for q in queues}
    if max_rows is None or sum(available.values()) <= max_rows:
        return {q: begin[q] + available[q] for q in queues}
    take = dict.fromkeys(queues, 0)
    budget = max(0, max_rows)
    hungry = [q for q in queues if available[q] > 0]
    while budget > 0 and hungry:
        share = max(1, budget // len(hungry))
        for q in list(hungry):
            grant = min(share, available[q] - take[q], budget)
            take[q] += grant
            budget -= grant
            if take[q] >= available[q]:
                hungry.remove(q)
            if budget == 0:
                break
    return {q: begin[q] + take[q] for q in queues}


def cap(offsets: Mapping[int, int], target: Mapping[int, int] | None) -> QueueOffsets:
    """``offsets`` no further than ``target`` (Trigger.AvailableNow's frozen end)."""
    if target is None:
        return dict(offsets)
    return {q: min(v, target.get(q, v)) for q, v in offsets.items()}


@dataclass(frozen=True, slots=True)
class QueueRange:
    """Queue offsets ``[begin, end)`` of one queue: what one Spark task pulls."""

    queue_id: int
    begin: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.begin


def split(start: Mapping[int, int], end: Mapping[int, int], chunk: int) -> list[QueueRange]:
    """The batch ``start → end`` as ranges of at most ``chunk`` offsets, queue by queue, so that
    a single busy queue is still read by several tasks in parallel."""
    ranges: list[QueueRange] = []
    step = max(1, chunk)
    for q in sorted(end):
        lo, hi = start.get(q, 0), end[q]
        while lo < hi:
            ranges.append(QueueRange(q, lo, min(hi, lo + step)))
            lo += step
    return ranges
