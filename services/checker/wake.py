"""When the checker scans next: at the earliest due time of the half copies it knows of.

A scan stops at the first half copy not yet due. Between scans the checker watches the half
queue from where it last looked (a ``halves`` request held at the end of the queue until a copy
arrives), learns the due time of every copy (``scanner.due_ms``: new halves, and the copies the
scan re-put) and sleeps until the earliest one plus ``slack``, never less than ``min_sleep`` (a
steady stream of halves costs at most one scan and one look per ``min_sleep``) and never more
than the check interval (the upper bound for re-checks, as before).

Due times are kept as a sliding-window minimum by queue offset: copies enter in offset order as
they are watched and leave from the front as the scan passes them (ended, checked, deferred or
discarded: a re-put copy is a new entry at the end).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from tidemq_server.checker.scanner import ScanConfig, due_ms

log = logging.getLogger(__name__)


class HalfSource(Protocol):
    async def halves(self, offset: int, max_count: int, wait_ms: int = 0) -> dict[str, Any]: ...


class DueTimes:
    """The earliest due time among the watched copies at or after an offset, in O(1) amortized:
    a copy with a later offset and an earlier due time makes the ones before it irrelevant."""

    def __init__(self) -> None:
        self._q: deque[tuple[int, int]] = deque()  # (queue offset, due ms), due increasing

    def add(self, offset: int, due: int) -> None:
        q = self._q
        while q and q[-1][1] >= due:
            q.pop()
        q.append((offset, due))

    def passed(self, offset: int) -> None:
        """The scan is at ``offset``: copies before it are resolved."""
        q = self._q
        while q and q[0][0] < offset:
            q.popleft()

    def earliest(self) -> int | None:
        return self._q[0][1] if self._q else None

    def clear(self) -> None:
        self._q.clear()

    def __len__(self) -> int:
        return len(self._q)


class HalfWatch:
    """Sleeps until the next scan is worth running, watching new half copies meanwhile."""

    def __init__(self, source: HalfSource, cfg: ScanConfig, *, min_sleep_s: float,
                 slack_s: float, clock: Callable[[], float] = time.time) -> None:
        self.source = source
        self.cfg = cfg
        self.min_sleep_s = min_sleep_s
        self.slack_s = slack_s
        self.clock = clock
        self.offset = 0  # next half queue offset to look at
        self.dues = DueTimes()
        self.head_due_ms: int | None = None  # due time of the copy the last scan stopped at

    def scanned(self, half_offset: int, head_due_ms: int | None = None) -> None:
        """A scan finished with its progress at ``half_offset``, stopped (if it did) at a
        copy due at ``head_due_ms``: a scan cannot pass that copy before then, so copies behind
        it that fall due sooner (a shorter own immunity, a producer's clock ahead) must not make
        the checker rescan every ``min_sleep``."""
        self.dues.passed(half_offset)
        self.offset = max(self.offset, half_offset)
        self.head_due_ms = head_due_ms

    def wake_at(self, began: float, longest_s: float) -> float:
        """The wall time to scan again, for a sleep that began at ``began``."""
        latest = began + longest_s
        earliest = self.dues.earliest()
        if earliest is None:
            return latest
        if self.head_due_ms is not None:
            earliest = max(earliest, self.head_due_ms)
        return min(latest, max(began + self.min_sleep_s, earliest / 1000 + self.slack_s))

    async def sleep(self, longest_s: float) -> None:
        """Until the next scan is due (at most ``longest_s``), watching the half queue."""
        began = self.clock()
        while True:
            now = self.clock()
            wake = self.wake_at(began, longest_s)
            if now >= wake:
                return
            page = await self.source.halves(self.offset, self.cfg.batch_size,
                                            wait_ms=max(1, int((wake - now) * 1000)))
            if int(page["max_offset"]) < self.offset:  # a new store under the same name
                log.info("half queue ends at %s, before the watched offset %d: watching it "
                         "from the start", page["max_offset"], self.offset)
                self.dues.clear()
                self.offset = int(page["min_offset"])
            for entry in page["entries"]:
                self.dues.add(int(entry["queue_offset"]), due_ms(entry, self.cfg))
            self.offset = max(self.offset, int(page["next_offset"]))
            if page["entries"] and self.offset >= int(page["max_offset"]):
                # caught up with a stream of halves: look again after a pause, not per copy
                pause = min(self.min_sleep_s, self.wake_at(began, longest_s) - self.clock())
                if pause > 0:
                    await asyncio.sleep(pause)
