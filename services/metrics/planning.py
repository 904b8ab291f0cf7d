"""Offsets of the event topic as Spark keeps them, read limits, and how a batch is split.

The event topic has queues on every broker group, so a position is keyed by
``(broker name, queue id)``. The broker name is ``""`` for the one broker of a fixed
``broker_url``. As a Spark source offset (kept in the checkpoint's offset log, so a restarted
query resumes exactly where the last committed batch ended) it is:

- ``{"queues": {"<queue id>": <next offset>}}`` when the only broker is the fixed one (the form
  of one-broker checkpoints, which therefore stay readable);
- ``{"brokers": {"<broker name>": {"<queue id>": <next offset>}}}`` otherwise.

Everything here is pure.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

QueueKey = tuple[str, int]  # (broker name, queue id); "" = the fixed broker_url
Offsets = dict[QueueKey, int]  # queue → queue offset
FIXED = ""  # the broker name of a fixed broker_url

K = TypeVar("K", bound=Hashable)


def to_spark(offsets: Mapping[QueueKey, int]) -> dict[str, Any]:
    """Queue offsets as a Spark source offset (JSON-friendly: string keys, sorted)."""
    names = sorted({b for b, _ in offsets})
    nested = {b: {str(q): int(offsets[(b, q)]) for bb, q in sorted(offsets) if bb == b}
              for b in names}
    if names in ([], [FIXED]):
        return {"queues": nested.get(FIXED, {})}
    return {"brokers": nested}


def from_spark(offset: Mapping[str, object] | None) -> Offsets:
    """A Spark source offset back to queue offsets (an empty or foreign dict → no queues)."""
    offset = offset or {}
    brokers = offset.get("brokers")
    nested: dict[str, Any] = {}
    if isinstance(brokers, dict):
        nested = brokers
    elif isinstance(offset.get("queues"), dict):
        nested = {FIXED: offset["queues"]}
    return {(str(b), int(q)): int(v) for b, queues in nested.items() if isinstance(queues, dict)
            for q, v in queues.items()}


def brokers_of(offsets: Mapping[QueueKey, int]) -> set[str]:
    return {b for b, _ in offsets}


def rename(offsets: Mapping[QueueKey, int], old: str, new: str) -> Offsets:
    """``offsets`` with broker ``old``'s queues moved under ``new``."""
    return {((new if b == old else b), q): v for (b, q), v in offsets.items()}


def advance(start: Mapping[K, int], latest: Mapping[K, int], max_rows: int | None) -> dict[K, int]:
    """End offsets of the next batch: every queue up to ``latest``, or at most ``max_rows``
    events in all, shared fairly between the queues that have events (water-filling: a queue
    with fewer events than its share leaves the rest to the others). A queue missing from
    ``latest`` (its broker did not answer) stays where it is."""
    queues = sorted(set(start) | set(latest))  # type: ignore[type-var]
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


def cap(offsets: Mapping[K, int], target: Mapping[K, int] | None) -> dict[K, int]:
    """``offsets`` no further than ``target`` (Trigger.AvailableNow's frozen end)."""
    if target is None:
        return dict(offsets)
    return {q: min(v, target.get(q, v)) for q, v in offsets.items()}


@dataclass(frozen=True, slots=True)
class QueueRange:
    """Queue offsets ``[begin, end)`` of one queue: what one Spark task pulls. ``broker`` is
    the group's name, ``address`` where it was found when the batch was planned (both empty
    for the fixed broker_url)."""

    queue_id: int
    begin: int
    end: int
    broker: str = FIXED
    address: str = ""

    @property
    def size(self) -> int:
        return self.end - self.begin


def split(start: Mapping[QueueKey, int], end: Mapping[QueueKey, int], chunk: int,
          addresses: Mapping[str, str] | None = None) -> list[QueueRange]:
    """The batch ``start → end`` as ranges of at most ``chunk`` offsets, queue by queue, so that
    a single busy queue is still read by several tasks in parallel. ``addresses``: broker name
    → base URL, carried in each range."""
    ranges: list[QueueRange] = []
    step = max(1, chunk)
    where = addresses or {}
    for key in sorted(end):
        broker, q = key
        lo, hi = start.get(key, 0), end[key]
        while lo < hi:
            ranges.append(QueueRange(q, lo, min(hi, lo + step), broker, where.get(broker, "")))
            lo += step
    return ranges
