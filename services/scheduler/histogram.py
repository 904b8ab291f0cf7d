"""Pending timers by due time, by hour or by day (read-only, from the bucket index).

A bucket covers ``bucket_ms`` of due times (an hour by default). When the asked width is a
whole number of buckets (an hour or a day with the default), a bucket's count is enough: the
live count of a loaded bucket, else its index entries less its final marks (no index is read).
Otherwise each index entry's due time is read. Only timers the scheduler has taken in are
counted; delay-level messages and timers still in the broker's intake topic are not (``GET
/v1/scheduled`` counts those).
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter

from tidemq_server.scheduler.buckets import ENTRY, ENTRY_SIZE, FINAL
from tidemq_server.scheduler.timers import TimerStore

WIDTHS_MS = {"hour": 3_600_000, "day": 86_400_000}


def _with_marks(store: TimerStore) -> set[int]:
    """Buckets with a marks file (one directory listing: most far buckets have none)."""
    try:
        names = os.listdir(store.buckets.dir)
    except FileNotFoundError:
        return set()
    return {int(n[:-5]) for n in names if n.endswith(".done") and n[:-5].isdigit()}


def _final_count(store: TimerStore, bucket: int, marked: set[int]) -> int:
    if bucket not in marked:
        return 0
    return sum(1 for mark in store.buckets.read_marks(bucket).values() if mark in FINAL)


def _count(store: TimerStore, width_ms: int, sizes: dict[int, int], live: dict[int, int]
           ) -> dict[int, int]:
    whole = width_ms % store.buckets.width_ms == 0
    marked = _with_marks(store)
    counts: Counter[int] = Counter()
    for bucket, size in sorted(sizes.items()):
        if whole:
            n = (live[bucket] if bucket in live
                 else size // ENTRY_SIZE - _final_count(store, bucket, marked))
            if n > 0:
                counts[bucket - bucket % width_ms] += n
            continue
        marks = store.buckets.read_marks(bucket) if bucket in marked else {}
        for due, pos, _, _, _ in ENTRY.iter_unpack(store.buckets.read_index(bucket, size)):
            if marks.get(pos) not in FINAL:
                counts[due - due % width_ms] += 1
    return dict(sorted(counts.items()))


async def histogram(store: TimerStore, by: str) -> dict[str, object]:
    """``{by, width_ms, buckets: [{start_ms, count}], timers}``: pending timers per hour or
    day of due time (UTC), earliest first."""
    width_ms = WIDTHS_MS[by]
    sizes = {b: s for b, s in store.buckets.sizes.items()}  # taken on the loop: a snapshot
    for bucket in store.live:
        sizes.setdefault(bucket, 0)
    live = dict(store.live)
    counts = await asyncio.to_thread(_count, store, width_ms, sizes, live)
    return {"by": by, "width_ms": width_ms,
            "buckets": [{"start_ms": start, "count": n} for start, n in counts.items()],
            "timers": sum(counts.values())}
