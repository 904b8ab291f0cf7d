"""Idempotent send: a (topic, message_id) stored within the window gets its first result again.

Three layers, cheapest first:

1. ``recent``: an insertion-ordered map of what this process stored, expired from the front by
   time (and by size: ``max_entries`` bounds memory);
2. ``in flight``: per key being stored right now, the future of its write (one per write, whose
   result lists the write's places) and its index in that write, so a concurrent duplicate
   waits for the first request's result instead of storing a second copy;
3. the store's unique-key index (``find_by_unique_key``), consulted only while the map cannot
   be complete for the window: during the first ``window_s`` after a start (messages stored by
   the previous run), or after the size bound evicted an entry younger than the window.

Only client-given ids are remembered: an id the broker assigned cannot be retried by a client
that never knew it, so remembering it would only cost memory.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import NamedTuple, overload

DedupKey = tuple[str, str]  # (topic, message_id)
#: What is kept per key: (queue id, queue offset, stored ms, waiting) - a Placed and its time.
Remembered = tuple[int, int, int, "tuple[int, int] | None"]


class Placed(NamedTuple):
    """Where a message was stored: the answer a duplicate gets. ``waiting``: for a delayed
    message's waiting copy, the queue id it will be delivered to and its due time (epoch ms)."""

    queue_id: int
    queue_offset: int
    waiting: tuple[int, int] | None = None


#: The future of one write of keys being stored: where each record of the write went (by index).
WriteFuture = asyncio.Future[Sequence["Placed | None"]]
#: A run of consecutive records of one write: queue id, queue offset of its first, count, stored ms.
Run = tuple[int, int, int, int]


class RunPlaces(Sequence[Placed]):
    """Where each record of a write of runs went, by its index in the write (computed when
    asked: a waiting duplicate asks for one)."""

    def __init__(self, runs: list[Run]) -> None:
        self.runs = runs
        self.starts: list[int] = []
        n = 0
        for run in runs:
            self.starts.append(n)
            n += run[2]
        self.size = n

    def __len__(self) -> int:
        return self.size

    @overload
    def __getitem__(self, i: int) -> Placed: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Placed]: ...

    def __getitem__(self, i: int | slice) -> Placed | Sequence[Placed]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self.size))]
        if not 0 <= i < self.size:
            raise IndexError(i)
        r = bisect_right(self.starts, i) - 1
        qid, first, _, _ = self.runs[r]
        return Placed(qid, first + i - self.starts[r])


class DedupCache:
    def __init__(self, window_s: float, max_entries: int, started_ms: int) -> None:
        self.window_ms = int(window_s * 1000)
        self.max_entries = max_entries
        # keys younger than this may be missing from ``_recent``; older ones are outside it
        self._complete_since_ms = started_ms
        self._recent: OrderedDict[DedupKey, Remembered] = OrderedDict()
        self._inflight: dict[DedupKey, tuple[WriteFuture, int]] = {}
        self.hits = 0  # duplicates answered without storing (metrics read it)

    @property
    def enabled(self) -> bool:
        return self.window_ms > 0

    def __len__(self) -> int:
        return len(self._recent)

    def count_hits(self, n: int) -> None:
        """``n`` duplicates were answered without storing them."""
        self.hits += n

    def mark_incomplete(self, now_ms: int) -> None:
        """The store now holds writes this process did not make (a replica was promoted):
        consult the index for the next window, as after a start."""
        self._complete_since_ms = max(self._complete_since_ms, now_ms)

    def needs_index(self, now_ms: int) -> bool:
        """True while a key within the window may be missing from memory."""
        return self.enabled and now_ms - self.window_ms < self._complete_since_ms

    def lookup(self, key: DedupKey, now_ms: int) -> Placed | None:
        entry = self._recent.get(key)
        if entry is None or entry[2] < now_ms - self.window_ms:
            return None
        return Placed(entry[0], entry[1], entry[3])

    def in_flight(self, key: DedupKey) -> tuple[WriteFuture, int] | None:
        """The future of the write storing ``key`` right now and its index there, or None."""
        return self._inflight.get(key)

    def begin(self, keys: Mapping[int, DedupKey] | Sequence[DedupKey]) -> WriteFuture:
        """Mark ``keys`` (index in one write → key; a sequence: by position) as being stored;
        duplicates arriving meanwhile await the returned future and take their index of its
        result."""
        fut: WriteFuture = asyncio.get_running_loop().create_future()
        inflight = self._inflight
        for i, key in keys.items() if isinstance(keys, Mapping) else enumerate(keys):
            inflight[key] = (fut, i)
        return fut

    def unknown(self, keys: Sequence[DedupKey], now_ms: int) -> bool:
        """True when no key of ``keys`` was stored within the window (as this process
        remembers it) or is being stored now."""
        recent, inflight = self._recent, self._inflight
        horizon = now_ms - self.window_ms
        for key in keys:
            entry = recent.get(key)
            if (entry is not None and entry[2] >= horizon) or key in inflight:
                return False
        return True

    def finish_runs(self, keys: Sequence[DedupKey], fut: WriteFuture, runs: list[Run]) -> None:
        """``finish`` for a write of consecutive ``runs`` whose record i has ``keys[i]``."""
        inflight, recent = self._inflight, self._recent
        enabled = self.enabled
        i = 0
        for qid, first, n, ms in runs:
            for j in range(n):
                key = keys[i]
                i += 1
                entry = inflight.get(key)
                if entry is not None and entry[0] is fut:
                    del inflight[key]
                if enabled:
                    if key in recent:
                        recent.move_to_end(key)
                    recent[key] = (qid, first + j, ms, None)
        self._evict()
        if not fut.done():
            fut.set_result(RunPlaces(runs))

    def finish(self, keys: Mapping[int, DedupKey], fut: WriteFuture,
               placed: Sequence[Placed | None] | None, error: BaseException | None = None,
               stored_ms: Sequence[int] = ()) -> None:
        """End an in-flight write: remember where each of ``keys`` went (``placed`` and
        ``stored_ms`` by index), or hand its error to the waiters."""
        inflight = self._inflight
        for i, key in keys.items():
            entry = inflight.get(key)
            if entry is not None and entry[0] is fut:
                del inflight[key]
            if placed is not None:
                where = placed[i]
                if where is not None:
                    self.remember(key, where, stored_ms[i])
        if fut.done():
            return
        if placed is not None:
            fut.set_result(placed)
        else:
            fut.set_exception(error or RuntimeError("store did not answer"))
            fut.exception()  # retrieved: nobody may be waiting

    def remember(self, key: DedupKey, placed: Placed, stored_ms: int) -> None:
        if not self.enabled:
            return
        self._recent[key] = (placed.queue_id, placed.queue_offset, stored_ms, placed.waiting)
        self._recent.move_to_end(key)
        self._evict()

    def _evict(self) -> None:
        """Keep at most ``max_entries``, dropping the oldest."""
        while len(self._recent) > self.max_entries:
            _, (_, _, ts, _) = self._recent.popitem(last=False)
            # an entry still inside the window was dropped: fall back to the index until it ages
            self._complete_since_ms = max(self._complete_since_ms, ts + 1)

    def expire(self, now_ms: int) -> None:
        """Drop entries older than the window (called once per send request)."""
        horizon = now_ms - self.window_ms
        recent = self._recent
        while recent:
            key = next(iter(recent))
            if recent[key][2] >= horizon:
                break
            del recent[key]
