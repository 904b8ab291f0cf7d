"""What consumers may see: records below the high-water mark, and wake-ups when it moves.

The store calls its listeners as soon as records are written (and dispatched); in a replicated
group the long-polls they would wake must wait until the records are below the HWM. So the
listener of a replicated store is ``Visibility.on_write``: it remembers which queues grew up to
which log end, and passes them to the real listener (the pull hold) when ``advance`` moves the
HWM past that end. ``store.limit_reads`` makes reads stop at the HWM.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from tidemq_server.broker.store.store import MessageStore

Key = tuple[str, int]


class Visibility:
    def __init__(self, store: MessageStore, notify: Callable[[set[Key]], None]) -> None:
        self.store = store
        self.notify = notify
        self.hwm = 0
        self.active = False  # reads stop at the HWM only in a replicated group
        self._pending: deque[tuple[int, set[Key]]] = deque()

    def activate(self) -> None:
        """From now on reads stop at the HWM (a replicated store only)."""
        self.active = True
        self.store.limit_reads(self.hwm)

    def on_write(self, touched: set[Key]) -> None:
        end = self.store.log.write_offset
        if end <= self.hwm:
            self.notify(touched)
        else:
            self._pending.append((end, set(touched)))

    def advance(self, hwm: int) -> None:
        """Records below ``hwm`` become visible (never moves back, except by ``reset``)."""
        if hwm <= self.hwm:
            return
        self.hwm = hwm
        if self.active:
            self.store.limit_reads(hwm)
        woken: set[Key] = set()
        while self._pending and self._pending[0][0] <= hwm:
            woken |= self._pending.popleft()[1]
        if woken:
            self.notify(woken)

    def reset(self, hwm: int) -> None:
        """A truncation or a new term: the mark restarts at ``hwm``."""
        self.hwm = hwm
        if self.active:
            self.store.limit_reads(hwm)
        self._pending = deque((e, k) for e, k in self._pending if e <= hwm)
