"""Shared helpers for the benchmarks: event loop choice, console, result table, JSON line."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

T = TypeVar("T")

err = Console(stderr=True)  # progress bars and chatter go to stderr
out = Console(width=None if sys.stdout.isatty() else 150)  # the result table goes to stdout


def loop_name() -> str:
    try:
        import uvloop
    except ImportError:
        return f"asyncio (uvloop not importable), Python {sys.version.split()[0]}"
    return f"uvloop {uvloop.__version__}, Python {sys.version.split()[0]}"


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on uvloop when it is importable, else on the default asyncio loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=False,
        refresh_per_second=4,
    )


@dataclass(slots=True)
class Row:
    figure: str
    value: float | None
    unit: str
    ratio: float | None = None  # None: not a ratio row
    target: str = ""
    met: bool | None = None  # None: no target


def fmt_value(v: float | None) -> str:
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:,.1f}"
    return f"{v:.3g}" if v else "0"


def print_table(title: str, rows: list[Row], caption: str = "") -> None:
    table = Table(title=title, caption=caption or None, caption_justify="left")
    for name, justify in (("figure", "left"), ("value", "right"), ("unit", "left"),
                          ("ratio", "right"), ("target", "left"), ("met?", "center")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        met = "" if r.met is None else ("yes" if r.met else "NO")
        style = None if r.met is not False else "red"
        table.add_row(r.figure, fmt_value(r.value), r.unit,
                      "" if r.ratio is None else f"{r.ratio:.2f}x", r.target, met, style=style)
    out.print(table)


def print_json(obj: dict[str, Any]) -> None:
    """One JSON object on one line: the last line of stdout."""
    sys.stdout.flush()
    print(json.dumps(obj, sort_keys=True, default=str), flush=True)
