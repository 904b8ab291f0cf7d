"""Which offset of a queue may be committed while messages finish out of order.

A queue's messages are handled concurrently, so offset 7 may finish before offset 5. The offset
committed to the group must be the *next offset to consume* such that everything before it is
finished: the smallest offset still in flight, or — with nothing in flight — the next offset
the pull will read (which may be past messages the broker skipped by tag).
"""

from __future__ import annotations

import heapq


class OffsetTracker:
    """In-flight offsets of one queue, and the committable offset they imply."""

    def __init__(self, start_offset: int) -> None:
        self._next_offset = start_offset  # next offset to pull
        self._in_flight: set[int] = set()
        self._heap: list[int] = []  # in-flight offsets, lazily pruned of finished ones
        self.committed: int | None = None  # last offset acknowledged by the broker

    @property
    def next_offset(self) -> int:
        return self._next_offset

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def pulled(self, offsets: list[int], next_offset: int) -> None:
        """Record a pull: ``offsets`` are now in flight and the pull goes on at ``next_offset``."""
        for offset in offsets:
            if offset not in self._in_flight:
                self._in_flight.add(offset)
                heapq.heappush(self._heap, offset)
        self._next_offset = max(self._next_offset, next_offset)

    def done(self, offset: int) -> None:
        """``offset`` is finished (consumed, or handed to the broker's retry)."""
        self._in_flight.discard(offset)
        heap = self._heap
        while heap and heap[0] not in self._in_flight:
            heapq.heappop(heap)

    def reset(self, offset: int) -> None:
        """Start over at ``offset`` (offset out of range); forgets everything in flight."""
        self._in_flight.clear()
        self._heap.clear()
        self._next_offset = offset

    def committable(self) -> int:
        """The offset to commit: everything below it is finished."""
        return self._heap[0] if self._heap else self._next_offset

    def commit_due(self) -> int | None:
        """The committable offset when it differs from the last committed one, else None."""
        offset = self.committable()
        return None if offset == self.committed else offset
