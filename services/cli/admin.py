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

from services.cli.rest import (
    CliError,
    call,
    console,
    endpoints,
    print_json,
    reports_errors,
    segment,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

topic_app = typer.Typer(help="Create, list, inspect and delete topics on the broker.",
                        no_args_is_help=True)

JsonOption = Annotated[bool, typer.Option("--json", help="Print the raw JSON answer.")]


@topic_app.command("create")
@reports_errors
def topic_create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Topic name: letters, digits, _ % | - (≤ 127).")],
    queues: Annotated[int, typer.Option(min=1, help="Number of queues.")] = 8,
    perm: Annotated[Perm, typer.Option(help="Permission: r, w or rw.")] = Perm.READ_WRITE,
    json_out: JsonOption = False,
) -> None:
    """Create a topic, or update its queue count and permission."""
    ep = endpoints(ctx)
    with ep.client() as client:
        topic = call(client, "PUT", f"{ep.broker}/v1/topics/{segment(name)}",
                     json={"queues": queues, "perm": perm.value})
    if json_out:
        print_json(topic)
        return
    console.print(f"topic [bold]{topic.get('name', name)}[/]: {topic.get('queues', queues)} "
                  f"queue(s), perm {topic.get('perm', perm.value)}")


@topic_app.command("list")
@reports_errors
def topic_list(ctx: typer.Context, json_out: JsonOption = False) -> None:
    """List the broker's topics."""
    ep = endpoints(ctx)
    with ep.client() as client:
        answer = call(client, "GET", f"{ep.broker}/v1/topics")
    if json_out:
        print_json(answer)
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
    with ep.client() as client:
        topic = call(client, "GET", f"{ep.broker}/v1/topics/{segment(name)}")
    if json_out:
        print_json(topic)
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
    json_out: JsonOption = False,
) -> None:
    """Delete a topic: it leaves the routes at once; its stored messages stay until retention
    removes them, unreadable unless the topic is created again."""
    ep = endpoints(ctx)
    if not yes and not typer.confirm(f"delete topic {name} on {ep.broker}?"):
        raise CliError("not deleted", 1)
    with ep.client() as client:
        answer = call(client, "DELETE", f"{ep.broker}/v1/topics/{segment(name)}")
    if json_out:
        print_json(answer)
        return
    console.print(f"topic [bold]{answer.get('deleted', name)}[/] deleted")


@reports_errors
def cluster(ctx: typer.Context, json_out: JsonOption = False) -> None:
    """Show the brokers registered with the nameserver and the topics they serve."""
    ep = endpoints(ctx)
    with ep.client() as client:
        answer = call(client, "GET", f"{ep.nameserver}/v1/cluster")
    if json_out:
        print_json(answer)
        return
    brokers: list[dict[str, Any]] = answer.get("brokers", [])
    if not brokers:
        console.print(f"no live broker is registered with {ep.nameserver}")
        return
    now_ms = time.time() * 1000
    table = Table("cluster", "broker", "address", "last heartbeat", "topics",
                  title=f"{len(brokers)} broker(s) registered with {ep.nameserver}")
    for broker in brokers:
        topics = broker.get("topics", {})
        age_s = max(0.0, (now_ms - float(broker.get("last_heartbeat_ms", now_ms))) / 1000)
        table.add_row(str(broker.get("cluster")), str(broker.get("broker_name")),
                      str(broker.get("address")), f"{age_s:.0f} s ago",
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
