"""The clock tests move by hand, and the ``clock`` fixture (tests/conftest.py) that makes one.

One object serves every shape a part takes its clock in:

- calling it answers ``now`` (seconds, float), as ``time.monotonic`` or ``time.time`` would;
  tests move it with ``clock.now += s`` or ``advance(s)``;
- ``ms()`` answers the wall clock in epoch milliseconds (``wall_ms``), ``monotonic_ms()`` a
  monotonic clock in milliseconds; ``advance(s)`` moves both as real time does, ``step_wall(s)``
  moves the wall clock alone, as an NTP step or a resumed VM does.

``now_ms()`` is the real wall clock in epoch milliseconds, the one tests compare due times and
store times with.
"""

from __future__ import annotations

import time


def now_ms() -> int:
    """The real wall clock, epoch milliseconds."""
    return time.time_ns() // 1_000_000


class FakeClock:
    def __init__(self, now: float = 100.0, wall_ms: int = 1_700_000_000_000,
                 monotonic_ms: int = 5_000) -> None:
        self.now = now
        self.wall_ms = wall_ms
        self.mono_ms = monotonic_ms

    def __call__(self) -> float:
        return self.now

    def ms(self) -> int:
        return self.wall_ms

    def monotonic_ms(self) -> int:
        return self.mono_ms

    def advance(self, seconds: float) -> None:
        self.now += seconds
        step = int(seconds * 1000)
        self.wall_ms += step
        self.mono_ms += step

    def step_wall(self, seconds: float) -> None:
        self.wall_ms += int(seconds * 1000)
