"""Admin commands: topics on the broker, the cluster view of the nameserver, benchmarks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text
from tidemq.protocol import Perm

from tidemq_server.cli import load, topic_groups
from tidemq_server.cli.errors import split_code
from tidemq_server.cli.rest import (
    CliError,
    JsonOption,
    call,
    cluster_view,
    console,
    endpoints,
    err_console,
    print_json,
    printed_json,
    reports_errors,
)
from tidemq_server.common.constants import BROKER_EXPIRY_S

REPO_ROOT = Path(__file__).resolve().parents[2]
HEALTH_TIMEOUT_S = 2.0  # `tidemq cluster`: one broker's /healthz (s)

topic_app = typer.Typer(help="Create, update, delete, list and inspect topics on every broker "
                             "group.",
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
        # every group failing the same way exits as that code does; mixed failures exit 1
        codes = {split_code(r.error or "")[0] for r in failed}
        raise CliError(f"{len(failed)} of {len(results)} group(s) failed: "
                       + ", ".join(r.broker_name for r in failed),
                       code=codes.pop() if len(codes) == 1 else None)


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
def topic_list(ctx: typer.Context, group: GroupOption = None, json_out: JsonOption = False
               ) -> None:
    """List the topics of every broker group (or the --group ones), each with its queues and
    permission per group."""
    ep = endpoints(ctx)
    with ep.client() as client:
        groups = topic_groups.choose_groups(client, ep, group)
        listed = {g.name: call(client, "GET", f"{g.address}/v1/topics") for g in groups}
    by_name: dict[str, list[dict[str, Any]]] = {}
    for name, answer in listed.items():
        for topic in answer.get("topics", []):
            if isinstance(topic, dict):
                by_name.setdefault(str(topic.get("name")), []).append(
                    {"broker_name": name, "queues": topic.get("queues"),
                     "perm": topic.get("perm")})
    if printed_json({"topics": [{"name": n, "groups": by_name[n]} for n in sorted(by_name)]},
                    json_out):
        return
    table = Table("topic", "queues", "groups", title=f"{len(by_name)} topic(s) on "
                  f"{len(groups)} broker group(s)")
    for name in sorted(by_name):
        shares = by_name[name]
        table.add_row(name, str(sum(int(g["queues"] or 0) for g in shares)),
                      ", ".join(f"{g['broker_name']} ({g['queues']}q {g['perm']})"
                                for g in shares))
    console.print(table)


@topic_app.command("show")
@reports_errors
def topic_show(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Topic name.")],
    group: GroupOption = None,
    json_out: JsonOption = False,
) -> None:
    """Show a topic on every broker group that has it, with the min and max offset of each
    queue."""
    ep = endpoints(ctx)
    with ep.client() as client:
        groups = topic_groups.choose_groups(client, ep, group)
        found = [(g, t) for g in groups if (t := topic_groups.read_topic(client, g, name))]
    if not found:
        raise CliError(f"TOPIC_NOT_FOUND: no group among {', '.join(g.name for g in groups)} "
                       f"has topic {name}: create it with `tidemq topic create {name}`")
    if printed_json({"name": name, "groups": [{"broker_name": g.name, **t} for g, t in found]},
                    json_out):
        return
    table = Table("group", "queue", "min offset", "max offset", "messages",
                  title=f"{name} on {len(found)} of {len(groups)} broker group(s)")
    for g, topic in found:
        table.add_section()
        for q in topic.get("offsets", []):
            low, high = int(q.get("min", 0)), int(q.get("max", 0))
            table.add_row(f"{g.name} ({topic.get('queues')}q {topic.get('perm')})",
                          str(q.get("queue_id")), str(low), str(high), str(high - low))
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
    answers) with their health (each one's /healthz, asked now), the topics they serve, and
    the cluster's nameservers."""
    ep = endpoints(ctx)
    with ep.client() as client:
        url, answer = cluster_view(client, ep)
        brokers: list[dict[str, Any]] = answer.get("brokers", [])
        with ThreadPoolExecutor(max(1, min(16, len(brokers)))) as pool:
            health = list(pool.map(lambda b: broker_health(client, str(b.get("address"))),
                                   brokers))
    for broker, (ok, said) in zip(brokers, health, strict=True):
        broker["health"] = "ok" if ok else said
    if printed_json(answer, json_out):
        return
    if not brokers:
        console.print(f"no live broker is registered with {url}")
        return
    now_ms = time.time() * 1000
    nameservers = answer.get("nameservers") or []
    table = Table("cluster", "broker", "address", "gRPC", "health", "last heartbeat", "topics",
                  title=f"{len(brokers)} broker(s) registered with {url}",
                  caption=f"nameservers: {', '.join(nameservers)}" if nameservers else None)
    for broker, (ok, said) in zip(brokers, health, strict=True):
        topics = broker.get("topics", {})
        age_s = max(0.0, (now_ms - float(broker.get("last_heartbeat_ms", now_ms))) / 1000)
        member = str(broker.get("broker_name"))
        role, broker_id = broker.get("role", "primary"), broker.get("broker_id", 0)
        if role != "primary" or broker_id:
            member += f" #{broker_id} {role}"
        table.add_row(str(broker.get("cluster")), member, str(broker.get("address")),
                      str(broker.get("grpc_address") or "-"),
                      Text("ok", style="green") if ok else Text(said, style="bold red"),
                      f"{age_s:.0f} s ago", _topic_summary(topics))
    console.print(table)
    down = sum(not ok for ok, _ in health)
    if down:
        err_console.print(f"{down} of {len(brokers)} broker(s) do not answer as healthy: the "
                          f"nameserver keeps a silent broker for up to {BROKER_EXPIRY_S:.0f} s")


def broker_health(client: httpx.Client, address: str) -> tuple[bool, str]:
    """(healthy, what it said) from a broker's ``/healthz``."""
    try:
        resp = client.get(f"{address}/healthz", timeout=HEALTH_TIMEOUT_S)
    except httpx.HTTPError as exc:
        return False, f"unreachable ({type(exc).__name__})"
    if resp.status_code == 200:
        return True, "ok"
    try:
        return False, f"{resp.json()['code']}: {resp.json()['message']}"
    except (ValueError, KeyError, TypeError):
        return False, f"HTTP {resp.status_code}"


def _topic_summary(topics: dict[str, Any], shown: int = 6) -> str:
    names = sorted(topics)
    text = ", ".join(f"{n} ({topics[n].get('queues', '?')}q)" for n in names[:shown])
    if len(names) > shown:
        text += f", … {len(names) - shown} more"
    return text or "-"


@reports_errors
def bench(
    ctx: typer.Context,
    topic: Annotated[str | None, typer.Option(
        help="Load the running cluster instead: send to this topic on every broker group of "
             "its route (found through --nameserver) and report each group's share.")] = None,
    messages: Annotated[int, typer.Option(min=1, help="With --topic: messages to send.")
                        ] = 10_000,
    batch: Annotated[int, typer.Option(min=1, max=1024, help="With --topic: per request.")
                     ] = 64,
    body_bytes: Annotated[int, typer.Option(min=0, help="With --topic: body size (bytes).")
                          ] = 128,
    workers: Annotated[int, typer.Option(min=1, max=load.MAX_WORKERS,
                                         help="With --topic: requests in flight.")] = 4,
    json_out: JsonOption = False,
) -> None:
    """Without --topic, run the benchmark suite (python -m bench.run_all: it starts its own
    processes; extra arguments such as --quick pass through). With --topic, load the running
    cluster: every broker group that serves the topic."""
    if topic is not None:
        _cluster_load(ctx, topic, messages, batch, body_bytes, workers, json_out)
        return
    if not (REPO_ROOT / "bench" / "run_all.py").exists():
        raise CliError(f"no benchmarks at {REPO_ROOT / 'bench' / 'run_all.py'}: "
                       "they ship with the source checkout")
    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": pythonpath}
    args = [*ctx.args, *(["--json"] if json_out else [])]
    proc = subprocess.Popen([sys.executable, "-m", "bench.run_all", *args],
                            cwd=REPO_ROOT, env=env)
    try:
        code = proc.wait()
    except KeyboardInterrupt:  # the benchmark got the same Ctrl-C; let it finish cleanly
        code = proc.wait()
    raise typer.Exit(code)


def _cluster_load(ctx: typer.Context, topic: str, messages: int, batch: int, body_bytes: int,
                  workers: int, json_out: bool) -> None:
    ep = endpoints(ctx)
    with ep.client() as client, Progress(
        TextColumn(f"sending to {topic}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=err_console, disable=json_out) as progress:
        groups = load.writable_groups(client, ep, topic)
        task = progress.add_task("load", total=messages)
        report = load.run_load(client, groups, topic, messages, batch, body_bytes, workers,
                               lambda n: progress.advance(task, n))
    if json_out:
        print_json(report.to_json())
    else:
        table = Table("broker group", "address", "sent", "msg/s",
                      title=f"{report.sent:,} message(s) of {body_bytes} B to {topic} in "
                            f"{report.elapsed_s:.2f} s: "
                            f"{report.sent / max(report.elapsed_s, 1e-9):,.0f} msg/s")
        for g in report.groups:
            table.add_row(g.broker_name, g.address, f"{g.sent:,}",
                          f"{g.sent / max(report.elapsed_s, 1e-9):,.0f}")
        console.print(table)
    if report.failures:
        raise CliError(f"{len(report.failures)} request(s) failed, e.g. {report.failures[0]}")
