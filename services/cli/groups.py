"""`tidemq group`: consumer groups on the broker — list them, show offsets and lag, reset.

``list`` shows ``GET /v1/groups``; ``offsets`` shows ``GET /v1/groups/{g}/offsets`` beside every
queue of the topic (a queue with no committed offset starts at its ``min``, so that is what its
lag counts from); ``reset`` commits new offsets with ``PUT /v1/groups/{g}/offsets``: each
queue's ``min`` (earliest), ``max`` (latest), or its first offset stored at or after a time
(``GET /v1/topics/{t}?at_ms=``).

A broker keeps the offsets of its own queues (per consumer group, topic, broker and queue). With
``--cluster`` each command acts on every broker group the nameserver lists instead of
``--broker``, and every row names its group (``broker_name``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import httpx
import typer
from rich.markup import escape
from rich.table import Table

from tidemq_server.cli.rest import (
    CliError,
    Endpoints,
    JsonOption,
    call,
    console,
    endpoints,
    err_console,
    print_json,
    printed_json,
    reports_errors,
    segment,
)
from tidemq_server.cli.topic_groups import choose_groups

group_app = typer.Typer(help="Consumer groups: list, offsets and lag, reset offsets.",
                        no_args_is_help=True)

GroupArgument = Annotated[str, typer.Argument(help="Consumer group.")]
TopicOption = Annotated[str, typer.Option("--topic", "-t", help="Topic.")]
ClusterOption = Annotated[bool, typer.Option(
    "--cluster", help="Every broker group the nameserver lists, instead of --broker.")]


def targets(client: httpx.Client, ep: Endpoints, cluster: bool) -> list[tuple[str | None, str]]:
    """(group name, base URL) of the brokers a command acts on; the name is None without
    ``--cluster`` (then rows carry no ``broker_name``)."""
    if not cluster:
        return [(None, ep.broker)]
    return [(g.name, g.address) for g in choose_groups(client, ep, None)]


def _named(rows: list[dict[str, Any]], name: str | None) -> list[dict[str, Any]]:
    return rows if name is None else [{"broker_name": name, **r} for r in rows]


@group_app.command("list")
@reports_errors
def group_list(ctx: typer.Context, json_out: JsonOption = False,
               cluster: ClusterOption = False) -> None:
    """List the consumer groups the broker knows: live members or committed offsets."""
    ep = endpoints(ctx)
    groups: list[dict[str, Any]] = []
    with ep.client() as client:
        where = targets(client, ep, cluster)
        for name, url in where:
            groups += _named(call(client, "GET", f"{url}/v1/groups").get("groups", []), name)
    if printed_json({"groups": groups}, json_out):
        return
    columns = ["broker"] if cluster else []
    table = Table(*columns, "group", "members", "mode", "topics",
                  title=f"{len(groups)} group(s)", caption=", ".join(u for _, u in where))
    for g in groups:
        members = g.get("members") or []
        first = [escape(str(g["broker_name"]))] if cluster else []
        table.add_row(*first, escape(str(g.get("group"))), str(len(members)),
                      str(g.get("mode") or "-"), escape(", ".join(g.get("topics") or []) or "-"))
    console.print(table)


def queue_rows(client: httpx.Client, broker: str, group: str, topic: str | None
               ) -> list[dict[str, Any]]:
    """Offsets of a group on one broker, one row per queue: every queue of ``topic`` when given
    (uncommitted ones start at the queue's min), else every queue with a committed offset."""
    params = {"topic": topic} if topic else None
    committed = call(client, "GET", f"{broker}/v1/groups/{segment(group)}/offsets",
                     params=params).get("offsets", [])
    if topic is None:
        return [{**o, "committed": True} for o in committed]
    info = call(client, "GET", f"{broker}/v1/topics/{segment(topic)}")
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
    cluster: ClusterOption = False,
) -> None:
    """Show a group's committed offsets, the queues' max offsets and the lag."""
    ep = endpoints(ctx)
    rows: list[dict[str, Any]] = []
    with ep.client() as client:
        where = targets(client, ep, cluster)
        for name, url in where:
            rows += _named(queue_rows(client, url, group, topic), name)
    if printed_json({"group": group, "offsets": rows}, json_out):
        return
    total = sum(int(r.get("lag", 0)) for r in rows)
    columns = ["broker"] if cluster else []
    table = Table(*columns, "topic", "queue", "offset", "max offset", "lag",
                  title=f"group {escape(group)}: lag {total}",
                  caption=", ".join(u for _, u in where))
    for r in rows:
        offset = str(r["offset"]) if r.get("committed", True) else f"{r['offset']} (none yet)"
        first = [escape(str(r["broker_name"]))] if cluster else []
        table.add_row(*first, escape(str(r["topic"])), str(r["queue_id"]), offset,
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
    cluster: ClusterOption = False,
) -> None:
    """Set a group's offsets on every queue of a topic (stop its consumers first: a running
    consumer commits its own position again)."""
    target = parse_target(to)
    ep = endpoints(ctx)
    key = "at" if isinstance(target, int) else "min" if target == "earliest" else "max"
    params = {"at_ms": target} if isinstance(target, int) else None
    rows: list[tuple[str | None, int, dict[str, Any] | None, int]] = []  # (broker, q, was, now)
    offsets: list[dict[str, Any]] = []
    members = 0
    with ep.client() as client:
        for name, url in targets(client, ep, cluster):
            info = call(client, "GET", f"{url}/v1/topics/{segment(topic)}", params=params)
            before = {r["queue_id"]: r for r in queue_rows(client, url, group, topic)}
            new = {int(q["queue_id"]): int(q[key]) for q in info.get("offsets", [])}
            body = [{"topic": topic, "queue_id": q, "offset": o} for q, o in sorted(new.items())]
            call(client, "PUT", f"{url}/v1/groups/{segment(group)}/offsets",
                 json={"offsets": body})
            offsets += _named(body, name)
            rows += [(name, q, before.get(q), o) for q, o in sorted(new.items())]
            members += sum(len(g.get("members") or []) for g in
                           call(client, "GET", f"{url}/v1/groups").get("groups", [])
                           if g.get("group") == group)
    if json_out:
        print_json({"group": group, "topic": topic, "offsets": offsets})
    else:
        columns = ["broker"] if cluster else []
        table = Table(*columns, "queue", "was", "now",
                      title=f"group {escape(group)} on {escape(topic)} reset to {escape(to)}")
        for name, qid, was, offset in rows:
            first = [escape(str(name))] if cluster else []
            table.add_row(*first, str(qid),
                          str(was["offset"]) if was and was["committed"] else "-", str(offset))
        console.print(table)
    if members:
        err_console.print(f"warning: group {group} has {members} live member(s)"
                          f"{' (counted per broker)' if cluster else ''}; they may commit their "
                          "own positions over this reset")
