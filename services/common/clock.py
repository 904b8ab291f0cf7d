"""Wall-clock time as the services record it: epoch milliseconds."""

from __future__ import annotations

import time


def now_ms() -> int:
    """Epoch milliseconds now (store and event timestamps, due times)."""
    return time.time_ns() // 1_000_000
