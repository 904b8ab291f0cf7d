"""Admin commands: topics on the broker, the cluster view of the nameserver, benchmarks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from tidemq.protocol import Perm

from services.cli import topic_groups
from services.cli.rest import (
    CliError,
    JsonOption,
    cluster_view,
    console,
    endpoints,
    err_console,
    print_json,
    printed_json,
    reports_errors,
    request,
    segment,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

topic_app = typer.Typer(help="Create, update and delete topics on every broker group; list and "
                             "inspect them on one broker.",
                        no_args_is_help=True)

GroupOption = Annotated[list[str] | None, typer.Option(
    "--group", "-g", help="Only this broker group (repeatable); default: every live group.")]


def _print_results(topic: str, results: list[topic_groups.GroupResult], json_out: bool,
                   key: str = "topic") -> None:
    if json_out:
        print_json({key: topic, "groups": [r.to_json() for r in results]})
    else:
        for r in results:
            detail = (f": {r.error}" if r.error else
                      f", {r.queues} queue(s), perm {r.perm}" if r.perm else
                      f", {r.queues} queue(s)" if r.queues else "")
            bad = r.result == topic_groups.FAILED
            (err_console if bad else console).print(
                f"topic [bold]{topic}[/] on {r.broker_name}: "
                f"[{'red' if bad else 'bold'}]{r.result}[/]{detail}", highlight=False)
    failed = topic_groups.failures(results)
    if failed:
        raise CliError(f"{len(failed)} of {len(results)} group(s) failed: "
                       + ", ".join(r.broker_name for r in failed))


@topic_app.command("create")
@reports_errors
def topic_create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Topic name: letters, digits, _ % | - (≤ 127).")],
    queues: Annotated[int, typer.Option(min=1, help="Number of queues on each group.")] = 8,
    perm: Annotated[Perm, typer.Option(help="Permission: r, w or rw.")] = Perm.READ_WRITE,
    group: GroupOption = None,
    json_out: JsonOption = False,
) -> None:
    """Create a topic on every broker group (or the --group ones). Creating it again with the
    same queues is a no-op; other queues or permission: use `tidemq topic update`."""
    ep = endpoints(ctx)
    with ep.client() as client:
        groups = topic_groups.choose_groups(client, ep, group)
        results = topic_groups.create(client, groups, name, queues, perm.value)
    _print_results(name, results, json_out)


@topic_app.command("update")
@reports_errors
def topic_update(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Topic name.")],
    queues: Annotated[int | None, typer.Option(
        min=1, help="New number of queues on each group (fewer only while the dropped "
                    "queues hold no messages).")] = None,
    perm: Annotated[Perm | None, typer.Option(help="New permission: r, w or rw.")] = None,
    group: GroupOption = None,
    json_out: JsonOption = False,
) -> None:
    """Change a topic's queue count or permission on every group that has it."""
    if queues is None and perm is None:
        raise CliError("BAD_REQUEST: give --queues and/or --perm", 2)
    ep = endpoints(ctx)
    with ep.client() as client:
        groups = topic_groups.choose_groups(client, ep, group)
        results = topic_groups.update(client, groups, name, queues,
                                      perm.value if perm is not None else None)
    _print_results(name, results, json_out)


@topic_app.command("list")
@reports_errors
def topic_list(ctx: typer.Context, json_out: JsonOption = False) -> None:
    """List the broker's topics."""
    ep = endpoints(ctx)
    answer = request(ep, "GET", f"{ep.broker}/v1/topics")
    if printed_json(answer, json_out):
        return
    topics: list[Any] = answer.get("topics", [])
    table = Table("topic", "queues", "perm", title=f"{len(topics)} topic(s)", caption=ep.broker)
    for topic in topics:
        if isinstance(topic, dict):
            table.add_row(str(topic.get("name", "?")), str(topic.get("queues", "")),
                          str(topic.get("perm", "")))
        else:
            table.add_row(str(topic), "", "")
    console.print(table)


@topic_app.command("show")
@reports_errors
def topic_show(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Topic name.")],
    json_out: JsonOption = False,
) -> None:
    """Show a topic with the min and max offset of each queue."""
    ep = endpoints(ctx)
    topic = request(ep, "GET", f"{ep.broker}/v1/topics/{segment(name)}")
    if printed_json(topic, json_out):
        return
    table = Table("queue", "min offset", "max offset", "messages",
                  title=f"{topic.get('name', name)}: {topic.get('queues')} queue(s), "
                        f"perm {topic.get('perm')}")
    for q in topic.get("offsets", []):
        low, high = int(q.get("min", 0)), int(q.get("max", 0))
        table.add_row(str(q.get("queue_id")), str(low), str(high), str(high - low))
    console.print(table)


@topic_app.command("delete")
@reports_errors
def topic_delete(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Topic name.")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")
                   ] = False,
    group: GroupOption = None,
    json_out: JsonOption = False,
) -> None:
    """Delete a topic on every broker group (or the --group ones): it leaves the routes at once;
    its stored messages stay until retention removes them, unreadable unless the topic is
    created again."""
    ep = endpoints(ctx)
    with ep.client() as client:
        groups = topic_groups.choose_groups(client, ep, group)
        where = ", ".join(g.name for g in groups)
        if not yes and not typer.confirm(f"delete topic {name} on {where}?"):
            raise CliError("not deleted", 1)
        results = topic_groups.delete(client, groups, name)
    _print_results(name, results, json_out, key="deleted")


@reports_errors
def cluster(ctx: typer.Context, json_out: JsonOption = False) -> None:
    """Show the brokers registered with the nameserver (the first of --nameserver that
    answers), the topics they serve, and the cluster's nameservers."""
    ep = endpoints(ctx)
    with ep.client() as client:
        url, answer = cluster_view(client, ep)
    if printed_json(answer, json_out):
        return
    brokers: list[dict[str, Any]] = answer.get("brokers", [])
    if not brokers:
        console.print(f"no live broker is registered with {url}")
        return
    now_ms = time.time() * 1000
    nameservers = answer.get("nameservers") or []
    table = Table("cluster", "broker", "address", "gRPC", "last heartbeat", "topics",
                  title=f"{len(brokers)} broker(s) registered with {url}",
                  caption=f"nameservers: {', '.join(nameservers)}" if nameservers else None)
    for broker in brokers:
        topics = broker.get("topics", {})
        age_s = max(0.0, (now_ms - float(broker.get("last_heartbeat_ms", now_ms))) / 1000)
        member = str(broker.get("broker_name"))
        role, broker_id = broker.get("role", "primary"), broker.get("broker_id", 0)
        if role != "primary" or broker_id:
            member += f" #{broker_id} {role}"
        table.add_row(str(broker.get("cluster")), member, str(broker.get("address")),
                      str(broker.get("grpc_address") or "-"), f"{age_s:.0f} s ago",
                      _topic_summary(topics))
    console.print(table)


def _topic_summary(topics: dict[str, Any], shown: int = 6) -> str:
    names = sorted(topics)
    text = ", ".join(f"{n} ({topics[n].get('queues', '?')}q)" for n in names[:shown])
    if len(names) > shown:
        text += f", … {len(names) - shown} more"
    return text or "-"


@reports_errors
def bench(ctx: typer.Context) -> None:
    """Run the benchmarks (python -m bench.run_all), passing extra arguments through."""
    if not (REPO_ROOT / "bench" / "run_all.py").exists():
        raise CliError(f"no benchmarks at {REPO_ROOT / 'bench' / 'run_all.py'}: "
                       "they ship with the source checkout")
    ep = endpoints(ctx)
    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": pythonpath,
           "TIDEMQ_BROKER_URL": ep.broker, "TIDEMQ_NAMESERVER_URL": ep.nameserver}
    proc = subprocess.Popen([sys.executable, "-m", "bench.run_all", *ctx.args],
                            cwd=REPO_ROOT, env=env)
    try:
        code = proc.wait()
    except KeyboardInterrupt:  # the benchmark got the same Ctrl-C; let it finish cleanly
        code = proc.wait()
    raise typer.Exit(code)
