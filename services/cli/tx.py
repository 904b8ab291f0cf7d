"""`tidemq tx`: transactions in flight on the broker (``GET /v1/transactions``), and ending one
by hand (``POST /v1/transactions/{id}/end``) when its producer cannot answer checks."""

from __future__ import annotations

import time
from enum import StrEnum
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

tx_app = typer.Typer(help="Transactional messages: what is still pending, ending one.",
                     no_args_is_help=True)


class EndAction(StrEnum):
    COMMIT = "commit"  # deliver the message
    ROLLBACK = "rollback"  # drop it: it is never delivered


@tx_app.command("list")
@reports_errors
def tx_list(
    ctx: typer.Context,
    group: Annotated[str | None, typer.Option("--group", "-g",
                                              help="Only this producer group.")] = None,
    max_count: Annotated[int, typer.Option("--max", min=1, max=10_000,
                                           help="At most this many.")] = 1000,
    json_out: JsonOption = False,
) -> None:
    """List pending (half) transactions with their check counts, oldest first."""
    ep = endpoints(ctx)
    params: dict[str, Any] = {"state": "pending", "max": max_count}
    if group:
        params["producer_group"] = group
    answer = request(ep, "GET", f"{ep.broker}/v1/transactions", params=params)
    if printed_json(answer, json_out):
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


@tx_app.command("end")
@reports_errors
def tx_end(
    ctx: typer.Context,
    transaction_id: Annotated[str, typer.Argument(help="Transaction id (see `tidemq tx list`).")],
    action: Annotated[EndAction, typer.Option(help="commit or rollback.")],
    producer_group: Annotated[str, typer.Option("--producer-group", "-g",
                                                help="The transaction's producer group.")],
    json_out: JsonOption = False,
) -> None:
    """Commit or roll back a pending transaction (as its producer would)."""
    ep = endpoints(ctx)
    answer = request(ep, "POST", f"{ep.broker}/v1/transactions/{segment(transaction_id)}/end",
                     json={"producer_group": producer_group, "action": action.value})
    if printed_json(answer, json_out):
        return
    console.print(f"transaction {transaction_id}: {answer.get('state')}", markup=False,
                  highlight=False)
