"""The delay-level table (docs/api.md#messages, ``delay_level``): parsed here, and only here,
for broker and scheduler.

A table is a space- (or comma-) separated list of durations, level 1 first:
``"1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"`` (the default). A duration is
a non-negative integer with a unit: ``ms``, ``s``, ``m``, ``h`` or ``d``.
"""

from __future__ import annotations

import re

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
MAX_DELAY_LEVELS = 18  # SCHEDULE_TOPIC_XXXX has one queue per level

_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION_RE = re.compile(r"^(\d+)(ms|s|m|h|d)$")


def parse_duration_ms(text: str) -> int:
    """``"90s"`` → 90000; raises ValueError naming the bad part."""
    match = _DURATION_RE.match(text.strip().lower())
    if match is None:
        raise ValueError(f"{text!r} is not a duration: use an integer with ms, s, m, h or d "
                         "(e.g. 500ms, 10s, 2h)")
    return int(match.group(1)) * _UNIT_MS[match.group(2)]


def parse_delay_levels(text: str) -> tuple[int, ...]:
    """The table as milliseconds per level (index 0 = level 1); raises ValueError."""
    parts = [p for p in re.split(r"[\s,]+", text.strip()) if p]
    if not 1 <= len(parts) <= MAX_DELAY_LEVELS:
        raise ValueError(f"a delay table has 1-{MAX_DELAY_LEVELS} levels, got {len(parts)}")
    levels = tuple(parse_duration_ms(p) for p in parts)
    if any(ms <= 0 for ms in levels):
        raise ValueError("every delay level must be longer than 0 ms")
    return levels


def format_duration(ms: int) -> str:
    """The shortest exact spelling of ``ms``: 3600000 → ``1h``, 1500 → ``1500ms``."""
    for unit in ("d", "h", "m", "s"):
        size = _UNIT_MS[unit]
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"
