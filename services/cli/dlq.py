"""`tidemq dlq resend`: send dead-lettered messages of a group back to their original topics.

What a resend stores is decided in tidemq_server.common.dlq (shared with the web console).

``--all`` resends from the group's committed offset on its DLQ (the start when there is none)
to the end, then commits the offset past the last message resent without a failure before
it, so the next ``--all`` continues there.
"""

from __future__ import annotations

from typing import Annotated, Any

import httpx
import typer
from rich.markup import escape
from rich.table import Table
from tidemq.protocol import dlq_topic

from tidemq_server.cli.rest import (
    CliError,
    Endpoints,
    call,
    console,
    endpoints,
    print_json,
    reports_errors,
    segment,
)
from tidemq_server.common.dlq import PAGE, Outcome, plan_resend

dlq_app = typer.Typer(help="Dead-letter queues: resend dead-lettered messages.",
                      no_args_is_help=True)

def resend_one(client: httpx.Client, ep: Endpoints, dlq: str, m: dict[str, Any]) -> Outcome:
    outcome, message = plan_resend(dlq, m)
    if message is None:
        return outcome
    try:
        earlier = call(client, "GET", f"{ep.broker}/v1/messages/{segment(message['message_id'])}")
    except CliError as exc:
        if not exc.message.startswith("MESSAGE_NOT_FOUND"):
            raise
    else:  # resent before: not again (the dedup window may have passed)
        outcome.result = {k: earlier.get(k) for k in ("message_id", "queue_id", "queue_offset")}
        outcome.earlier = True
        return outcome
    try:
        answer = call(client, "POST", f"{ep.broker}/v1/topics/{segment(outcome.topic)}/messages",
                      json={"messages": [message]})
        outcome.result = answer.get("results", [{}])[0]
    except CliError as exc:
        if exc.message.startswith("UNAVAILABLE: cannot reach"):
            raise  # the broker is gone: stop, nothing more can be resent
        outcome.error = exc.message
    return outcome


def dlq_messages(client: httpx.Client, ep: Endpoints, dlq: str, queue_id: int, start: int,
                 end: int) -> list[dict[str, Any]]:
    """The messages of one DLQ queue from ``start`` up to ``end`` (exclusive)."""
    url = f"{ep.broker}/v1/topics/{segment(dlq)}/queues/{queue_id}/messages"
    found: list[dict[str, Any]] = []
    offset = start
    while offset < end:
        page = call(client, "GET", url, params={"offset": offset, "max": PAGE, "wait_ms": 0})
        found.extend(m for m in page.get("messages", []) if int(m["queue_offset"]) < end)
        next_offset = int(page.get("next_offset", offset))
        if next_offset <= offset:
            break
        offset = next_offset
    return found


@dlq_app.command("resend")
@reports_errors
def dlq_resend(
    ctx: typer.Context,
    group: Annotated[str, typer.Argument(help="Consumer group whose DLQ to read.")],
    message_id: Annotated[str | None, typer.Option("--message-id", help="Resend only this "
                                                   "dead-lettered message.")] = None,
    resend_all: Annotated[bool, typer.Option("--all", help="Resend every message not resent "
                                             "by an earlier --all.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON result per line.")
                        ] = False,
) -> None:
    """Resend dead-lettered messages of a group to their original topics."""
    if bool(message_id) == resend_all:
        raise CliError("BAD_REQUEST: give either --message-id ID or --all", 2)
    ep = endpoints(ctx)
    dlq = dlq_topic(group)
    outcomes: list[Outcome] = []
    with ep.client() as client:
        info = call(client, "GET", f"{ep.broker}/v1/topics/{segment(dlq)}")
        committed: dict[int, int] = {}
        if resend_all:
            answer = call(client, "GET", f"{ep.broker}/v1/groups/{segment(group)}/offsets",
                          params={"topic": dlq})
            committed = {int(o["queue_id"]): int(o["offset"]) for o in answer.get("offsets", [])}
        progress: list[dict[str, Any]] = []
        for q in info.get("offsets", []):
            qid, low, high = int(q["queue_id"]), int(q.get("min", 0)), int(q.get("max", 0))
            start = max(low, committed.get(qid, low)) if resend_all else low
            messages = dlq_messages(client, ep, dlq, qid, start, high)
            if message_id:
                messages = [m for m in messages if m.get("message_id") == message_id][:1]
            done, blocked = start, False  # progress stops at the first failure
            for m in messages:
                outcome = resend_one(client, ep, dlq, m)
                outcomes.append(outcome)
                blocked = blocked or outcome.result is None
                if not blocked:
                    done = outcome.queue_offset + 1
            if resend_all and done > committed.get(qid, low):
                progress.append({"topic": dlq, "queue_id": qid, "offset": done})
        if progress:
            call(client, "PUT", f"{ep.broker}/v1/groups/{segment(group)}/offsets",
                 json={"offsets": progress})
    if message_id and not outcomes:
        raise CliError(f"MESSAGE_NOT_FOUND: no message {message_id!r} in {dlq}")
    _report(outcomes, dlq, json_out)
    if any(o.result is None for o in outcomes):
        raise typer.Exit(1)


def _report(outcomes: list[Outcome], dlq: str, json_out: bool) -> None:
    if json_out:
        for outcome in outcomes:
            print_json(outcome.to_json())
        return
    failed = sum(o.result is None for o in outcomes)
    before = sum(o.earlier for o in outcomes)
    table = Table("dlq offset", "message id", "to topic", "result",
                  title=f"{dlq}: {len(outcomes) - failed - before} resent, {failed} failed"
                        + (f", {before} resent before (not again)" if before else ""))
    for o in outcomes:
        if o.result is not None:
            result = (f"[green]{'resent before as' if o.earlier else 'sent'}[/] "
                      f"{escape(str(o.result.get('message_id')))} queue "
                      f"{o.result.get('queue_id')} offset {o.result.get('queue_offset')}")
        else:
            result = f"[red]{escape(o.error)}[/]"
        table.add_row(f"{o.queue_id}:{o.queue_offset}", escape(o.message_id),
                      escape(o.topic or "?"), result)
    console.print(table)
