"""Inline SVG chart geometry, computed here so the templates only draw: bars (lag per queue,
timers per hour or day) and a line (a group's lag over time). No script, no CDN."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

HOUR_MS = 3_600_000
DAY_MS = 86_400_000
HOUR_BARS = 48  # the hour histogram shows this many hours from the first one with timers
DAY_BARS = 31  # the day histogram shows at most this many days


@dataclass
class Bar:
    x: int
    y: int
    h: int
    label: str
    title: str


@dataclass
class BarChart:
    width: int
    height: int
    peak: int
    bars: list[Bar]
    baseline: int


def bar_chart(values: list[tuple[str, int, str]], bar_w: int = 20, gap: int = 6,
              plot_h: int = 100, label_every: int = 1) -> BarChart:
    """``values``: (axis label, value, hover title) per bar, left to right."""
    peak = max([v for _, v, _ in values] or [0])
    step, left, base = bar_w + gap, 30, plot_h + 5
    bars = []
    for i, (label, value, title) in enumerate(values):
        h = round(plot_h * value / peak) if peak else 0
        bars.append(Bar(left + i * step, base - h, h,
                        label if i % label_every == 0 else "", title))
    return BarChart(left + len(values) * step + 10, base + 25, peak, bars, base)


def timer_bars(buckets: list[dict[str, Any]], by: str) -> tuple[BarChart, int]:
    """A contiguous run of hours (or days) from the first with timers; (chart, timers beyond
    the shown window)."""
    width, limit = (HOUR_MS, HOUR_BARS) if by == "hour" else (DAY_MS, DAY_BARS)
    counts = {int(b["start_ms"]): int(b["count"]) for b in buckets}
    if not counts:
        return bar_chart([]), 0
    first = min(counts)
    values = []
    for i in range(limit):
        start = first + i * width
        if start > max(counts):
            break
        dt = datetime.fromtimestamp(start / 1000, UTC)
        label = dt.strftime("%H") if by == "hour" else dt.strftime("%d")
        title = dt.strftime("%Y-%m-%d %H:00 UTC" if by == "hour" else "%Y-%m-%d UTC")
        n = counts.get(start, 0)
        values.append((label, n, f"{title}: {n} timer(s)"))
    shown_until = first + limit * width
    beyond = sum(n for s, n in counts.items() if s >= shown_until)
    return bar_chart(values, bar_w=14 if by == "hour" else 20, gap=3 if by == "hour" else 6,
                     label_every=3 if by == "hour" else 1), beyond


@dataclass
class LineChart:
    width: int
    height: int
    points: str  # SVG polyline points
    peak: int
    first: int  # epoch ms of the first sample
    last: int
    dots: list[tuple[int, int, str]]  # (x, y, title) of each sample


def line_chart(samples: list[tuple[int, int]], width: int = 480, plot_h: int = 100) -> LineChart:
    """A group's lag over time: ``samples`` are (epoch ms, lag), oldest first."""
    if not samples:
        return LineChart(width, plot_h + 30, "", 0, 0, 0, [])
    peak = max(v for _, v in samples) or 1
    first, last = samples[0][0], samples[-1][0]
    span = max(1, last - first)
    left, base, plot_w = 40, plot_h + 5, width - 50
    dots = []
    for t, v in samples:
        x = left + round(plot_w * (t - first) / span) if len(samples) > 1 else left
        y = base - round(plot_h * v / peak)
        stamp = datetime.fromtimestamp(t / 1000, UTC).strftime("%H:%M:%S UTC")
        dots.append((x, y, f"{stamp}: lag {v}"))
    return LineChart(width, base + 25, " ".join(f"{x},{y}" for x, y, _ in dots),
                     max(v for _, v in samples), first, last, dots)


def sparkline(samples: list[tuple[int, int]], width: int = 120, height: int = 24) -> str:
    """SVG polyline points of a small lag-over-time line ("" with fewer than two samples)."""
    if len(samples) < 2:
        return ""
    peak = max(v for _, v in samples) or 1
    first, span = samples[0][0], max(1, samples[-1][0] - samples[0][0])
    return " ".join(f"{round((width - 2) * (t - first) / span) + 1},"
                    f"{height - 1 - round((height - 2) * v / peak)}" for t, v in samples)
