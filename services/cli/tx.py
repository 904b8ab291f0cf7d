"""`tidemq tx`: transactions in flight on the broker (``GET /v1/transactions``)."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.table import Table

from services.cli.rest import call, console, endpoints, print_json, reports_errors

tx_app = typer.Typer(help="Transactional messages: what is still pending.", no_args_is_help=True)


@tx_app.command("list")
@reports_errors
def tx_list(
    ctx: typer.Context,
    group: Annotated[str | None, typer.Option("--group", "-g",
                                              help="Only this producer group.")] = None,
    max_count: Annotated[int, typer.Option("--max", min=1, max=10_000,
                                           help="At most this many.")] = 1000,
    json_out: Annotated[bool, typer.Option("--json", help="Print the raw JSON answer.")] = False,
) -> None:
    """List pending (half) transactions with their check counts, oldest first."""
    ep = endpoints(ctx)
    params: dict[str, Any] = {"state": "pending", "max": max_count}
    if group:
        params["producer_group"] = group
    with ep.client() as client:
        answer = call(client, "GET", f"{ep.broker}/v1/transactions", params=params)
    if json_out:
        print_json(answer)
        return
    found: list[dict[str, Any]] = answer.get("transactions", [])
    now_ms = time.time() * 1000
    table = Table("transaction", "message id", "group", "topic", "checks", "age",
                  title=f"{len(found)} pending transaction(s)", caption=ep.broker)
    for tx in found:
        age_s = max(0.0, now_ms - float(tx.get("born_timestamp_ms", now_ms))) / 1000
        table.add_row(str(tx.get("transaction_id")), str(tx.get("message_id")),
                      str(tx.get("producer_group", "")), str(tx.get("topic")),
                      str(tx.get("check_times", 0)), f"{age_s:.1f}s")
    console.print(table)
