"""Console benchmark: the time to load every console page with many topics and pending timers.

Run ``python -m bench.console [--quick] [--json]``.

A redis-server, a nameserver, a broker (``max_reconsume_times=0``: a failed message goes
straight to the DLQ), its scheduler and the console run as child processes on free ports (data
in a temp dir). The bench then creates, over the broker's public API:

* T topics (full 1,000, quick 200) with 2 queues each, one ``PUT /v1/topics/{t}`` per topic,
  and waits until the nameserver routes all of them;
* N pending timers (full 100,000, quick 10,000), ``POST /v1/topics/{t}/messages`` with 1,024
  messages (100-byte bodies) per request, round robin over the topics, ``delay_ms`` spread over
  1-30 days; then waits until the scheduler holds them all (``GET /v1/scheduled``, pending);
* a little of everything else, so that no page is empty: 200 plain messages with keys in one
  topic, a consumer group's committed offsets on every topic, 20 pending transactions and 20
  dead letters.

Then it GETs each console page (cluster, topics, one topic, groups, one group, message search
by key, one message by id, transactions, timers, one timer, dead letters) R times (full 7,
quick 3) after one warm-up, one request at a time with httpx: median and max wall time, the
server-side time the page footer shows ("rendered in N ms": gathering from the cluster, before
the template), and the page size.

Target (the console's issue): every page loads in under a second (max of the R loads < 1 s).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import msgpack
from rich.table import Table

from bench._common import Row, err, loop_name, out, print_json, print_table, progress, run
from bench._peers import Child, free_port, python_service, redis_server

MSGPACK = {"content-type": "application/msgpack", "accept": "application/msgpack"}
TOKEN = "bench-token"
QUEUES = 2
BODY = b"x" * 100
DAY_MS = 86_400_000
SEND_BATCH = 1024
SENDERS = 2  # send requests in flight (modest: the bench shares the machine)
TARGET_MS = 1000.0
RENDERED = re.compile(r"rendered in (\d+) ms")


@dataclass(frozen=True, slots=True)
class Sizes:
    topics: int
    timers: int
    repeats: int


FULL = Sizes(topics=1_000, timers=100_000, repeats=7)
QUICK = Sizes(topics=200, timers=10_000, repeats=3)


class System:
    """redis-server + nameserver + broker + scheduler + console."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        cluster = f"bench-{uuid.uuid4().hex[:8]}"
        (workdir / "redis").mkdir(parents=True, exist_ok=True)
        self.redis = redis_server(workdir / "redis", appendonly=True)
        ns_port, broker_port, sched_port, console_port = (free_port() for _ in range(4))
        self.ns_url = f"http://127.0.0.1:{ns_port}"
        self.url = f"http://127.0.0.1:{broker_port}"
        self.sched_url = f"http://127.0.0.1:{sched_port}"
        self.console_url = f"http://127.0.0.1:{console_port}"
        self.nameserver = Child("nameserver", [sys.executable, "-m", "tidemq_server.nameserver"],
                                ns_port, workdir, {
                                    "TIDEMQ_NAMESRV_PORT": str(ns_port),
                                    "TIDEMQ_NAMESRV_TOKEN": TOKEN,
                                    "TIDEMQ_NAMESRV_LOG_LEVEL": "warning"}, health="/healthz")
        redis_url = f"redis://127.0.0.1:{self.redis.port}/0"
        self.broker = python_service("broker", broker_port, workdir, {
            "TIDEMQ_BROKER_PORT": str(broker_port),
            "TIDEMQ_BROKER_DATA_DIR": str(workdir / "broker"),
            "TIDEMQ_BROKER_REDIS_URL": redis_url, "TIDEMQ_BROKER_CLUSTER": cluster,
            "TIDEMQ_BROKER_TOKEN": TOKEN, "TIDEMQ_BROKER_LOG_LEVEL": "warning",
            "TIDEMQ_BROKER_GRPC_ENABLED": "false", "TIDEMQ_BROKER_NAMESERVERS": self.ns_url,
            "TIDEMQ_BROKER_MAX_RECONSUME_TIMES": "0",
            "TIDEMQ_BROKER_SCHEDULER_URL": self.sched_url,
        })
        self.scheduler = python_service("scheduler", sched_port, workdir, {
            "TIDEMQ_SCHEDULER_PORT": str(sched_port), "TIDEMQ_SCHEDULER_BROKER_URL": self.url,
            "TIDEMQ_SCHEDULER_REDIS_URL": redis_url, "TIDEMQ_SCHEDULER_CLUSTER": cluster,
            "TIDEMQ_SCHEDULER_TOKEN": TOKEN,
            "TIDEMQ_SCHEDULER_DATA_DIR": str(workdir / "scheduler"),
            "TIDEMQ_SCHEDULER_LOG_LEVEL": "warning",
        })
        self.console = python_service("console", console_port, workdir, {
            "TIDEMQ_CONSOLE_PORT": str(console_port), "TIDEMQ_CONSOLE_NAMESERVERS": self.ns_url,
            "TIDEMQ_CONSOLE_TOKEN": TOKEN, "TIDEMQ_CONSOLE_SCHEDULERS": self.sched_url,
            "TIDEMQ_CONSOLE_LOG_LEVEL": "warning",
        })
        self.children = [self.redis, self.nameserver, self.broker, self.scheduler, self.console]

    async def start(self) -> None:
        for child in self.children:
            await asyncio.to_thread(child.start)
        err.print(f"pids: nameserver {self.nameserver.pid}, broker {self.broker.pid}, "
                  f"scheduler {self.scheduler.pid}, console {self.console.pid}")

    async def close(self) -> None:
        for child in reversed(self.children):
            await asyncio.to_thread(child.stop)


# --- seeding -----------------------------------------------------------------------------------
async def post(http: httpx.AsyncClient, url: str, **kwargs: Any) -> httpx.Response:
    """POST, retrying while the broker answers 503 (back-pressure)."""
    while True:
        resp = await http.post(url, **kwargs)
        if resp.status_code != 503:
            if resp.status_code != 200:
                raise RuntimeError(f"POST {url}: {resp.status_code} {resp.text[:300]}")
            return resp
        await asyncio.sleep(0.05)


async def create_topics(s: System, http: httpx.AsyncClient, topics: list[str]) -> float:
    began = time.perf_counter()
    with progress() as bar:
        task = bar.add_task("creating topics", total=len(topics))
        for t in topics:
            resp = await http.put(f"{s.url}/v1/topics/{t}", json={"queues": QUEUES})
            if resp.status_code != 200:
                raise RuntimeError(f"PUT topic {t}: {resp.status_code} {resp.text[:300]}")
            bar.advance(task)
    created_s = time.perf_counter() - began
    want = set(topics)
    deadline = time.monotonic() + 120
    while True:  # the nameserver routes them all (the console finds topics there)
        answer = (await http.get(f"{s.ns_url}/v1/cluster")).json()
        routed = set().union(*[set(b.get("topics") or {}) for b in answer.get("brokers", [])])
        if want <= routed:
            return created_s
        if time.monotonic() > deadline:
            raise RuntimeError(f"the nameserver routes {len(want & routed)} of {len(want)} "
                               "bench topics after 120 s")
        await asyncio.sleep(0.5)


def delay_of(i: int, n: int) -> int:
    """Delays spread over 1-30 days (a stride through the span, so every batch is spread)."""
    span = 29 * DAY_MS - 3_600_000  # under the broker's 30-day limit, whatever the send lag
    return DAY_MS + (i * 7_919_993 + (i * span) // max(1, n)) % span


async def send_timers(s: System, http: httpx.AsyncClient, topics: list[str], n: int) -> float:
    began = time.perf_counter()
    starts = list(range(0, n, SEND_BATCH))
    with progress() as bar:
        task = bar.add_task("sending timers", total=n)

        async def sender(k: int) -> None:
            for j, start in enumerate(starts[k::SENDERS]):
                topic = topics[(k + j * SENDERS) % len(topics)]
                msgs = [{"message_id": f"timer-{i}", "body": BODY, "delay_ms": delay_of(i, n),
                         "keys": [f"tk-{i % 997}"]}
                        for i in range(start, min(n, start + SEND_BATCH))]
                await post(http, f"{s.url}/v1/topics/{topic}/messages", headers=MSGPACK,
                           content=msgpack.packb({"messages": msgs}, use_bin_type=True))
                bar.advance(task, len(msgs))

        await asyncio.gather(*(sender(k) for k in range(SENDERS)))
    return time.perf_counter() - began


async def taken_in(s: System, http: httpx.AsyncClient, n: int) -> float:
    began = time.perf_counter()
    with progress() as bar:
        task = bar.add_task("scheduler taking them in", total=n)
        while True:
            resp = await http.get(f"{s.url}/v1/scheduled")
            pending = int(resp.json().get("pending", 0)) if resp.status_code == 200 else 0
            bar.update(task, completed=min(pending, n))
            if pending >= n:
                return time.perf_counter() - began
            await asyncio.sleep(0.5)


async def seed_rest(s: System, http: httpx.AsyncClient, topics: list[str]) -> dict[str, str]:
    """Plain messages with keys, a group's offsets, pending transactions, dead letters."""
    topic = topics[0]
    msgs = [{"message_id": f"plain-{i}", "body": f'{{"order": {i}}}', "keys": [f"order-{i % 20}"],
             "tag": "Paid", "queue_id": i % QUEUES} for i in range(200)]
    await post(http, f"{s.url}/v1/topics/{topic}/messages", json={"messages": msgs})
    group = "bench-billing"
    offsets = [{"topic": t, "queue_id": q, "offset": 0} for t in topics for q in range(QUEUES)]
    for k in range(0, len(offsets), 500):  # the group consumes every topic
        resp = await http.put(f"{s.url}/v1/groups/{group}/offsets",
                              json={"offsets": offsets[k:k + 500]})
        resp.raise_for_status()
    for i in range(20):
        await post(http, f"{s.url}/v1/transactions", json={
            "producer_group": f"bench-tx-{i % 3}", "topic": topic,
            "message": {"body": f"order {i} created"}, "check_immunity_s": 3600})
    dlq_group = "bench-dlqg"
    for i in range(20):
        resp = await http.post(f"{s.url}/v1/groups/{dlq_group}/retry",
                               json={"message_id": f"plain-{i}"})
        resp.raise_for_status()
    return {"topic": topic, "group": group, "dlq_group": dlq_group, "message": "plain-7"}


# --- pages -------------------------------------------------------------------------------------
def pages(seeded: dict[str, str], n_timers: int) -> list[tuple[str, str]]:
    t, g = quote(seeded["topic"], safe=""), quote(seeded["group"], safe="")
    timer = f"timer-{n_timers // 2}"
    return [
        ("cluster", "/"),
        ("topics (all)", "/topics"),
        ("one topic", f"/topics?topic={t}"),
        ("groups (all)", "/groups"),
        ("one group", f"/groups?group={g}"),
        ("messages: search by key", f"/messages?topic={t}&key=order-7"),
        ("messages: by id", f"/messages?id={seeded['message']}"),
        ("transactions", "/transactions"),
        ("timers", "/timers"),
        ("timers: one timer", f"/timers?id={timer}"),
        ("dead letters (form)", "/dlq"),
        ("dead letters of a group", f"/dlq?group={quote(seeded['dlq_group'], safe='')}"),
    ]


@dataclass(slots=True)
class PageResult:
    name: str
    path: str
    wall_ms: list[float]
    server_ms: list[float]
    size: int
    error: str


def measure(console_url: str, name: str, path: str, repeats: int) -> PageResult:
    wall: list[float] = []
    server: list[float] = []
    size, error = 0, ""
    with httpx.Client(base_url=console_url, timeout=60) as http:
        http.get(path)  # warm-up (connection, template compile)
        for _ in range(repeats):
            began = time.perf_counter()
            resp = http.get(path)
            wall.append((time.perf_counter() - began) * 1000)
            size = len(resp.content)
            if resp.status_code != 200:
                error = f"HTTP {resp.status_code}"
            elif 'class="error"' in resp.text:
                m = re.search(r'class="error"[^>]*>([^<]*)<', resp.text)
                error = m.group(1)[:120] if m else "error box"
            m = RENDERED.search(resp.text)
            if m:
                server.append(float(m.group(1)))
    return PageResult(name, path, wall, server, size, error)


async def run_all(tmp: Path, sizes: Sizes) -> dict[str, Any]:
    s = System(tmp)
    await s.start()
    res: dict[str, Any] = {"topics": sizes.topics, "timers": sizes.timers}
    try:
        async with httpx.AsyncClient(timeout=120) as http:
            topics = [f"BenchTopic-{i:04d}" for i in range(sizes.topics)]
            res["create_topics_s"] = await create_topics(s, http, topics)
            err.print(f"{len(topics):,} topics created in {res['create_topics_s']:.1f} s")
            seeded = await seed_rest(s, http, topics)
            res["send_timers_s"] = await send_timers(s, http, topics, sizes.timers)
            res["taken_in_s"] = await taken_in(s, http, sizes.timers)
            sched = (await http.get(f"{s.url}/v1/scheduled")).json()
            res["pending"] = sched.get("pending")
            err.print(f"{sizes.timers:,} timers sent in {res['send_timers_s']:.1f} s; the "
                      f"scheduler holds {res['pending']:,} pending")
        results = []
        for name, path in pages(seeded, sizes.timers):
            r = await asyncio.to_thread(measure, s.console_url, name, path, sizes.repeats)
            err.print(f"{name:28s} median {statistics.median(r.wall_ms):7.1f} ms, max "
                      f"{max(r.wall_ms):7.1f} ms, {r.size / 1024:7.1f} KiB"
                      + (f"  [red]{r.error}[/]" if r.error else ""))
            results.append(r)
        res["pages"] = results
    finally:
        await s.close()
    return res


def build_rows(res: dict[str, Any]) -> list[Row]:
    rows = []
    for r in res["pages"]:
        med, worst = statistics.median(r.wall_ms), max(r.wall_ms)
        rows.append(Row(f"GET {r.name} (median)", med, "ms",
                        target=f"max {worst:,.0f} ms < {TARGET_MS:,.0f} ms"
                        + (f"; {r.error}" if r.error else ""),
                        met=worst < TARGET_MS and not r.error))
    return rows


def detail_table(res: dict[str, Any]) -> Table:
    table = Table(title="console pages: detail", caption_justify="left")
    for name, justify in (("page", "left"), ("path", "left"), ("median ms", "right"),
                          ("max ms", "right"), ("server ms (median)", "right"),
                          ("KiB", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in res["pages"]:
        table.add_row(r.name, r.path if len(r.path) < 48 else r.path[:45] + "...",
                      f"{statistics.median(r.wall_ms):,.1f}", f"{max(r.wall_ms):,.1f}",
                      f"{statistics.median(r.server_ms):,.0f}" if r.server_ms else "-",
                      f"{r.size / 1024:,.1f}")
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.console", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="200 topics and 10,000 timers, 3 loads per page (about 1 minute)")
    ap.add_argument("--json", action="store_true",
                    help="print one JSON object with every figure as the last line of stdout")
    ap.add_argument("--dir", default=None, help="parent of the scratch directory (default: /tmp)")
    args = ap.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    loop = loop_name()
    err.print(f"console bench ({'quick' if args.quick else 'full'}), event loop: {loop}")
    began = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="tidemq-console-bench-", dir=args.dir))
    try:
        res = run(run_all(tmp, sizes))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    total = time.perf_counter() - began
    print_table(f"tidemq console bench ({'quick' if args.quick else 'full'}): "
                f"{res['topics']:,} topics, {res['pending']:,} pending timers", build_rows(res),
                caption=f"{os.cpu_count()} CPUs, {loop}, {total:.0f} s in all; "
                        f"{sizes.repeats} loads per page after a warm-up, one at a time")
    out.print(detail_table(res))
    if args.json:
        print_json({
            "bench": "console", "quick": args.quick, "event_loop": loop,
            "topics": res["topics"], "timers": res["timers"], "pending": res["pending"],
            "create_topics_s": res["create_topics_s"], "send_timers_s": res["send_timers_s"],
            "pages": {r.name: {"path": r.path, "median_ms": statistics.median(r.wall_ms),
                               "max_ms": max(r.wall_ms),
                               "server_ms": statistics.median(r.server_ms) if r.server_ms
                               else None, "bytes": r.size, "error": r.error or None}
                      for r in res["pages"]},
            "slowest_page_max_ms": max(max(r.wall_ms) for r in res["pages"]),
            "all_pages_under_1s": all(max(r.wall_ms) < TARGET_MS and not r.error
                                      for r in res["pages"]),
            "seconds": round(total, 1),
        })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
