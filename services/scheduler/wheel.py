"""The near window in memory: timers of the loaded buckets, in slots of ``tick_ms``.

Each slot keeps three flat arrays (due ms, log position, entry size): 20 bytes per near timer
and no Python object per timer. A timer sits in slot ``max(due, bucket start) // tick`` — a
timer filed under a later bucket than its due time (it arrived late) waits in that bucket's
first slot — so the bucket of a slot is ``slot * tick`` rounded down to the bucket width.
``pop_due`` hands over every timer whose due time has come, in slot order.
"""

from __future__ import annotations

import bisect
import heapq
from array import array
from dataclasses import dataclass, field


@dataclass(slots=True)
class Due:
    """Timers handed over for delivery, all from one bucket."""

    bucket: int
    dues: array[int]
    positions: array[int]
    sizes: array[int]


@dataclass(slots=True)
class Slot:
    dues: array[int] = field(default_factory=lambda: array("q"))
    positions: array[int] = field(default_factory=lambda: array("q"))
    sizes: array[int] = field(default_factory=lambda: array("I"))
    ordered: bool = False  # entries sorted by due time (appends undo it)

    def __len__(self) -> int:
        return len(self.dues)

    def add(self, due: int, pos: int, size: int) -> None:
        if self.ordered and self.dues and due < self.dues[-1]:
            self.ordered = False
        self.dues.append(due)
        self.positions.append(pos)
        self.sizes.append(size)

    def extend(self, other: Slot) -> None:
        self.ordered = False
        self.dues.extend(other.dues)
        self.positions.extend(other.positions)
        self.sizes.extend(other.sizes)

    def sort(self) -> None:
        """Order the entries by due time (once, for the slot being handed over in parts)."""
        order = sorted(range(len(self.dues)), key=self.dues.__getitem__)
        self.dues = array("q", [self.dues[i] for i in order])
        self.positions = array("q", [self.positions[i] for i in order])
        self.sizes = array("I", [self.sizes[i] for i in order])
        self.ordered = True

    def split(self, now: int) -> Due | None:
        """Hand over the entries due at ``now`` (the slot is sorted first), keep the rest."""
        if not self.ordered:
            self.sort()
        cut = bisect.bisect_right(self.dues, now)
        if not cut:
            return None
        due = Due(0, self.dues[:cut], self.positions[:cut], self.sizes[:cut])
        del self.dues[:cut], self.positions[:cut], self.sizes[:cut]
        return due


class Wheel:
    def __init__(self, tick_ms: int, width_ms: int) -> None:
        self.tick_ms = tick_ms
        self.width_ms = width_ms
        self.slots: dict[int, Slot] = {}
        self._heap: list[int] = []  # slot numbers with timers (may hold stale ones)
        self.count = 0

    def slot_of(self, due: int, bucket: int) -> int:
        return max(due, bucket) // self.tick_ms

    def bucket_of_slot(self, slot: int) -> int:
        ms = slot * self.tick_ms
        return ms - ms % self.width_ms

    def add(self, due: int, pos: int, size: int, bucket: int) -> None:
        n = self.slot_of(due, bucket)
        slot = self.slots.get(n)
        if slot is None:
            slot = self.slots[n] = Slot()
            heapq.heappush(self._heap, n)
        slot.add(due, pos, size)
        self.count += 1

    def merge(self, slots: dict[int, Slot]) -> None:
        """Add whole slots (a bucket loaded from disk)."""
        for n, part in slots.items():
            slot = self.slots.get(n)
            if slot is None:
                self.slots[n] = part
                heapq.heappush(self._heap, n)
            else:
                slot.extend(part)
            self.count += len(part)

    def remove(self, due: int, pos: int, bucket: int) -> bool:
        """Take one timer out (a cancel); False when it is not in the wheel."""
        slot = self.slots.get(self.slot_of(due, bucket))
        if slot is None:
            return False
        try:
            i = slot.positions.index(pos)
        except ValueError:
            return False
        del slot.dues[i], slot.positions[i], slot.sizes[i]
        self.count -= 1
        return True

    def pop_due(self, now: int) -> list[Due]:
        """Every timer due at ``now`` (slot order; within a slot, arrival order)."""
        out: list[Due] = []
        current = now // self.tick_ms
        while self._heap and self._heap[0] <= current:
            n = self._heap[0]
            slot = self.slots.get(n)
            if slot is None or not len(slot):
                heapq.heappop(self._heap)
                self.slots.pop(n, None)
                continue
            if n < current or (slot.ordered and slot.dues[-1] <= now):
                heapq.heappop(self._heap)
                del self.slots[n]
                out.append(Due(self.bucket_of_slot(n), slot.dues, slot.positions, slot.sizes))
                self.count -= len(slot)
                continue
            # the current slot: hand over what is due, keep the rest
            part = slot.split(now)
            if part is not None:
                part.bucket = self.bucket_of_slot(n)
                out.append(part)
                self.count -= len(part.dues)
            break
        return out

    def next_due(self) -> int | None:
        """The earliest due time in the wheel, None when empty."""
        while self._heap:
            n = self._heap[0]
            slot = self.slots.get(n)
            if slot is not None and len(slot):
                return min(slot.dues)
            heapq.heappop(self._heap)  # emptied by cancels
            self.slots.pop(n, None)
        return None

    def holds(self, due: int, pos: int, bucket: int) -> bool:
        slot = self.slots.get(self.slot_of(due, bucket))
        return slot is not None and pos in slot.positions

