"""The delay-level table (services/common/delaylevels.py), shared by broker and scheduler."""

from __future__ import annotations

import pytest

from tidemq_server.common.delaylevels import (
    DEFAULT_DELAY_LEVELS,
    format_duration,
    parse_delay_levels,
    parse_duration_ms,
)

DAY = 86_400_000


def test_delay_table_parsing() -> None:
    levels = parse_delay_levels(DEFAULT_DELAY_LEVELS)
    assert len(levels) == 18
    assert levels[:4] == (1000, 5000, 10_000, 30_000) and levels[-1] == 7_200_000
    assert parse_delay_levels("250ms, 1s 2m") == (250, 1000, 120_000)
    assert parse_duration_ms("3d") == 3 * DAY
    assert format_duration(3_600_000) == "1h" and format_duration(1500) == "1500ms"
    for bad in ("", "1s " * 19, "1x", "0s", "-1s"):
        with pytest.raises(ValueError):
            parse_delay_levels(bad)
