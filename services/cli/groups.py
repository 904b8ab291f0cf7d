"""`tidemq group`: consumer groups on the broker — list them, show offsets and lag, reset.

``list`` shows ``GET /v1/groups``; ``offsets`` shows ``GET /v1/groups/{g}/offsets`` beside every
queue of the topic (a queue with no committed offset starts at its ``min``, so that is what its
lag counts from); ``reset`` commits new offsets with ``PUT /v1/groups/{g}/offsets``: each
queue's ``min`` (earliest), ``max`` (latest), or its first offset stored at or after a time
(``GET /v1/topics/{t}?at_ms=``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import httpx
import typer
from rich.markup import escape
from rich.table import Table

from services.cli.rest import (
    CliError,
    Endpoints,
    call,
    console,
    endpoints,
    err_console,
    print_json,
    reports_errors,
    segment,
)

group_app = typer.Typer(help="Consumer groups: list, offsets and lag, reset offsets.",
                        no_args_is_help=True)

JsonOption = Annotated[bool, typer.Option("--json", help="Print the raw JSON answer.")]
GroupArgument = Annotated[str, typer.Argument(help="Consumer group.")]
TopicOption = Annotated[str, typer.Option("--topic", "-t", help="Topic.")]


@group_app.command("list")
@reports_errors
def group_list(ctx: typer.Context, json_out: JsonOption = False) -> None:
    """List the consumer groups the broker knows: live members or committed offsets."""
    ep = endpoints(ctx)
    with ep.client() as client:
        answer = call(client, "GET", f"{ep.broker}/v1/groups")
    if json_out:
        print_json(answer)
        return
    groups: list[dict[str, Any]] = answer.get("groups", [])
    table = Table("group", "members", "mode", "topics", title=f"{len(groups)} group(s)",
                  caption=ep.broker)
    for g in groups:
        members = g.get("members") or []
        table.add_row(escape(str(g.get("group"))), str(len(members)), str(g.get("mode") or "-"),
                      escape(", ".join(g.get("topics") or []) or "-"))
    console.print(table)


def queue_rows(client: httpx.Client, ep: Endpoints, group: str, topic: str | None
               ) -> list[dict[str, Any]]:
    """Offsets of a group, one row per queue: every queue of ``topic`` when given (uncommitted
    ones start at the queue's min), else every queue with a committed offset."""
    params = {"topic": topic} if topic else None
    committed = call(client, "GET", f"{ep.broker}/v1/groups/{segment(group)}/offsets",
                     params=params).get("offsets", [])
    if topic is None:
        return [{**o, "committed": True} for o in committed]
    info = call(client, "GET", f"{ep.broker}/v1/topics/{segment(topic)}")
    by_queue = {int(o["queue_id"]): o for o in committed if o.get("topic", topic) == topic}
    rows = []
    for q in info.get("offsets", []):
        qid, low, high = int(q["queue_id"]), int(q.get("min", 0)), int(q.get("max", 0))
        found = by_queue.get(qid)
        offset = int(found["offset"]) if found else low
        rows.append({"topic": topic, "queue_id": qid, "offset": offset, "max_offset": high,
                     "lag": max(0, high - offset), "committed": found is not None})
    return rows


@group_app.command("offsets")
@reports_errors
def group_offsets(
    ctx: typer.Context,
    group: GroupArgument,
    topic: Annotated[str | None, typer.Option("--topic", "-t", help="Only this topic (shows "
                                              "its queues with no committed offset too).")
                     ] = None,
    json_out: JsonOption = False,
) -> None:
    """Show a group's committed offsets, the queues' max offsets and the lag."""
    ep = endpoints(ctx)
    with ep.client() as client:
        rows = queue_rows(client, ep, group, topic)
    if json_out:
        print_json({"group": group, "offsets": rows})
        return
    total = sum(int(r.get("lag", 0)) for r in rows)
    table = Table("topic", "queue", "offset", "max offset", "lag",
                  title=f"group {escape(group)}: lag {total}", caption=ep.broker)
    for r in rows:
        offset = str(r["offset"]) if r.get("committed", True) else f"{r['offset']} (none yet)"
        table.add_row(escape(str(r["topic"])), str(r["queue_id"]), offset,
                      str(r["max_offset"]), str(r["lag"]))
    console.print(table)
    if not rows:
        err_console.print(f"group {group} has no committed offsets"
                          + (f" for {topic}" if topic else ""))


def parse_target(to: str) -> str | int:
    """``earliest``, ``latest``, or a time: epoch milliseconds, or an ISO 8601 date/time (local
    time unless it carries an offset) → epoch ms."""
    if to in ("earliest", "latest"):
        return to
    if to.isdigit():
        return int(to)
    try:
        return int(datetime.fromisoformat(to).timestamp() * 1000)
    except ValueError:
        raise CliError(f"BAD_REQUEST: --to must be earliest, latest, epoch milliseconds or an "
                       f"ISO time like 2025-01-31T12:00:00, got {to!r}", 2) from None


@group_app.command("reset")
@reports_errors
def group_reset(
    ctx: typer.Context,
    group: GroupArgument,
    topic: TopicOption,
    to: Annotated[str, typer.Option(help="earliest | latest | a time (epoch ms or ISO 8601): "
                                         "the first message stored at or after it.")],
    json_out: JsonOption = False,
) -> None:
    """Set a group's offsets on every queue of a topic (stop its consumers first: a running
    consumer commits its own position again)."""
    target = parse_target(to)
    ep = endpoints(ctx)
    with ep.client() as client:
        params = {"at_ms": target} if isinstance(target, int) else None
        info = call(client, "GET", f"{ep.broker}/v1/topics/{segment(topic)}", params=params)
        before = {r["queue_id"]: r for r in queue_rows(client, ep, group, topic)}
        key = "at" if isinstance(target, int) else "min" if target == "earliest" else "max"
        new = {int(q["queue_id"]): int(q[key]) for q in info.get("offsets", [])}
        body = {"offsets": [{"topic": topic, "queue_id": q, "offset": o}
                            for q, o in sorted(new.items())]}
        call(client, "PUT", f"{ep.broker}/v1/groups/{segment(group)}/offsets", json=body)
        live = [g for g in call(client, "GET", f"{ep.broker}/v1/groups").get("groups", [])
                if g.get("group") == group and g.get("members")]
    if json_out:
        print_json({"group": group, "topic": topic, "offsets": body["offsets"]})
    else:
        table = Table("queue", "was", "now", title=f"group {escape(group)} on {escape(topic)} "
                                                   f"reset to {escape(to)}")
        for qid, offset in sorted(new.items()):
            was = before.get(qid)
            table.add_row(str(qid), str(was["offset"]) if was and was["committed"] else "-",
                          str(offset))
        console.print(table)
    if live:
        err_console.print(f"warning: group {group} has {len(live[0]['members'])} live "
                          "member(s); they may commit their own positions over this reset")
