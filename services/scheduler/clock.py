"""The scheduler's clock: "early" and "late" are judged by it
(docs/architecture.md#delayed-messages).

Wall time plus an offset. The offset is 0 in production; tests set it (or advance it at run
time through ``POST /internal/v1/clock`` when ``test_clock`` is on) to compress long delays.
It only ever moves forward.
"""

from __future__ import annotations

import time


class Clock:
    def __init__(self, offset_ms: int = 0) -> None:
        self.offset_ms = offset_ms

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000 + self.offset_ms

    def advance(self, ms: int) -> None:
        if ms < 0:
            raise ValueError("the scheduler's clock only moves forward")
        self.offset_ms += ms
