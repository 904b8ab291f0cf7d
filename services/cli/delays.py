"""`tidemq delay`: delayed messages pending on the broker, and cancelling one.

``list`` shows ``GET /v1/scheduled`` (pending count, next due time, per level); ``cancel``
sends ``DELETE /v1/messages/{id}/schedule`` (``?topic=`` with ``--topic``). Both go to the
broker, which asks its scheduler.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from tidemq_server.cli.rest import (
    JsonOption,
    console,
    endpoints,
    printed_json,
    reports_errors,
    request,
    segment,
)
from tidemq_server.common.delaylevels import DEFAULT_DELAY_LEVELS

delay_app = typer.Typer(help="Delayed messages: list what is pending, cancel one.",
                        no_args_is_help=True)

def _due(ms: int | None) -> str:
    if ms is None:
        return "-"
    when = datetime.fromtimestamp(ms / 1000).isoformat(sep=" ", timespec="milliseconds")
    left = ms / 1000 - time.time()
    return f"{when} ({'in ' + _span(left) if left > 0 else _span(-left) + ' ago'})"


def _span(seconds: float) -> str:
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.1f}s"


@delay_app.command("list")
@reports_errors
def delay_list(
    ctx: typer.Context,
    topic: Annotated[str | None, typer.Option(help="Only messages of this topic.")] = None,
    json_out: JsonOption = False,
) -> None:
    """Show pending delayed messages: how many, the next due time, and per delay level."""
    ep = endpoints(ctx)
    answer: dict[str, Any] = request(ep, "GET", f"{ep.broker}/v1/scheduled",
                                     params={"topic": topic} if topic else {})
    if printed_json(answer, json_out):
        return
    names = DEFAULT_DELAY_LEVELS.split()
    by_level = answer.get("by_level", {})
    table = Table("kind", "pending", title=f"{answer.get('pending', 0)} delayed message(s) "
                  f"pending{' in ' + topic if topic else ''}; next due "
                  f"{_due(answer.get('next_due_ms'))}", caption=ep.broker)
    table.add_row("timers (delay_ms / deliver_at_ms)", str(answer.get("timers", 0)))
    for level, count in sorted(by_level.items(), key=lambda kv: int(kv[0])):
        if count:
            n = int(level)
            default = f" (default {names[n - 1]})" if n <= len(names) else ""
            table.add_row(f"level {n}{default}", str(count))
    console.print(table)


@delay_app.command("cancel")
@reports_errors
def delay_cancel(
    ctx: typer.Context,
    message_id: Annotated[str, typer.Argument(help="Id of the delayed message.")],
    topic: Annotated[str | None, typer.Option(
        help="The topic it was sent to: ids are unique per topic only (without it, an id "
             "delayed in several topics is refused: AMBIGUOUS_MESSAGE_ID).")] = None,
    json_out: JsonOption = False,
) -> None:
    """Cancel a delayed message that was not delivered yet (ALREADY_DELIVERED if too late)."""
    ep = endpoints(ctx)
    answer = request(ep, "DELETE", f"{ep.broker}/v1/messages/{segment(message_id)}/schedule",
                     params={"topic": topic} if topic else {})
    if printed_json(answer, json_out):
        return
    console.print(f"message [bold]{message_id}[/]: {answer.get('state', 'cancelled')}")
