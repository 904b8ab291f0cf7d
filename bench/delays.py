"""Delayed-delivery benchmark: lateness, a burst, and the cost of far-future timers.

Run ``python -m bench.delays [--quick] [--json]``.

A redis-server, a broker and a scheduler run as child processes on free ports (data in a temp
dir); timers are sent through the broker's public API (msgpack, 1024 per request, 100-byte
bodies, ``deliver_at_ms``) and read back from their topic with raw pulls. Lateness is the
delivered copy's ``store_timestamp_ms`` minus its ``deliver_at_ms`` (one host, one clock).

a. lateness   N timers spread evenly over the next S seconds, starting after a lead time that
              covers sending them (full: 1,000,000 over 600 s; quick: 100,000 over 60 s):
              lateness p50/p99/max, and the scheduler's resident memory (peak).
b. burst      B timers due within the same second (full 200,000; quick 20,000), sent early
              enough to be taken in before it: seconds from the start of that second until the
              last one is stored in its topic (read back afterwards, so that the bench's reader
              does not compete with the delivery it measures).
c. far        F timers with 100-byte bodies spread over the next 30 days (full 10,000,000;
              quick 1,000,000; sent with 4096 per request, in four parts) into a freshly
              restarted scheduler, after a warm-up: disk bytes per timer, and resident memory
              per timer as the least-squares slope of the scheduler's (median-sampled) RSS
              against the timers it holds after each part (the raw last-minus-first too).

e. together   20,000 timers due at the same millisecond (quick and full alike), sent ahead:
              lateness p50/p99/max (the issue's "20,000 timers due together").

d. rate       1,000 timers due at 1 k/s (one a millisecond for one second; quick and full
              alike), sent ahead: lateness p50/p99/max (NATS 2.15's message schedules: p99
              256 ms, the issue's reference figure; not measured here).

f. first      first delays of a fresh topic, before anything else runs (the first round is
              the first delay the fresh broker and scheduler ever see): on each of R new topics
              (full 10, quick 5) a level-1 message and a 1 s timer, read back by pulls every
              100 ms: lateness of the first round's and the worst round's of each kind.

Targets (2 cores): lateness p99 <= 200 ms; burst <= 5 s, and its timers' lateness p99 <= 600
ms, as for 20,000 due at one moment; at 1 k/s lateness p99 <= 50 ms; RAM <= 1 byte per far
timer; a first delay of a fresh topic <= 1 s late (the design's precision goal) and never
early.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
import uuid
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgpack
import psutil

from bench._common import Row, err, loop_name, print_json, print_table, progress, run
from bench._peers import free_port, python_service, redis_server

MSGPACK = {"content-type": "application/msgpack", "accept": "application/msgpack"}
TOKEN = "bench-token"
QUEUES = 8
BODY = b"x" * 100
DAY_MS = 86_400_000
SEND_BATCH = 1024
FAR_BATCH = 4096
SENDERS = 4  # send requests in flight

TARGET_P99_MS = 200.0
TARGET_BURST_S = 5.0
TARGET_BURST_P99_MS = 600.0  # issue 33: 20,000 timers due together, lateness p99
TARGET_RATE_P99_MS = 50.0  # issue 33: 1,000 timers at 1 k/s, lateness p99
RATE_TIMERS = 1000  # (d) one due each millisecond
TOGETHER_TIMERS = 20_000  # (e) all due at the same millisecond
RATE_LEAD_S = 3.0  # (d) the first is due this long after sending starts
TARGET_RAM_PER_TIMER = 1.0
TARGET_FIRST_MS = 1000.0  # a first delay of a fresh topic at most this late (the design's goal)
FIRST_POLL_S = 0.1  # (f) the reader pulls this often
LEVEL_1_MS = 1000  # (f) the default delay table's level 1, as long as the timer sent with it


@dataclass(frozen=True, slots=True)
class Sizes:
    timers: int  # (a)
    spread_s: float
    lead_s: float  # (a) the first timer is due this long after sending starts
    burst: int  # (b)
    burst_lead_s: float
    far: int  # (c)
    fresh: int  # (f) new topics, each with a level-1 message and a 1 s timer


FULL = Sizes(timers=1_000_000, spread_s=600.0, lead_s=60.0, burst=200_000, burst_lead_s=30.0,
             far=10_000_000, fresh=10)
QUICK = Sizes(timers=100_000, spread_s=60.0, lead_s=10.0, burst=20_000, burst_lead_s=6.0,
              far=1_000_000, fresh=5)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Cluster:
    """redis-server + broker + scheduler, wired together."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        cluster = f"bench-{uuid.uuid4().hex[:8]}"
        self.redis = redis_server(workdir / "redis", appendonly=True)
        self.broker_port, self.sched_port = free_port(), free_port()
        redis_url = f"redis://127.0.0.1:{self.redis.port}/0"
        self.broker = python_service("broker", self.broker_port, workdir, {
            "TIDEMQ_BROKER_PORT": str(self.broker_port),
            "TIDEMQ_BROKER_DATA_DIR": str(workdir / "broker"),
            "TIDEMQ_BROKER_REDIS_URL": redis_url, "TIDEMQ_BROKER_CLUSTER": cluster,
            "TIDEMQ_BROKER_TOKEN": TOKEN, "TIDEMQ_BROKER_LOG_LEVEL": "warning",
            "TIDEMQ_BROKER_GRPC_ENABLED": "false",
            "TIDEMQ_BROKER_MAX_BATCH_MESSAGES": str(FAR_BATCH),
            "TIDEMQ_BROKER_SCHEDULER_URL": f"http://127.0.0.1:{self.sched_port}",
        })
        self.sched_dir = workdir / "scheduler"
        self.scheduler = python_service("scheduler", self.sched_port, workdir, {
            "TIDEMQ_SCHEDULER_PORT": str(self.sched_port),
            "TIDEMQ_SCHEDULER_BROKER_URL": f"http://127.0.0.1:{self.broker_port}",
            "TIDEMQ_SCHEDULER_REDIS_URL": redis_url, "TIDEMQ_SCHEDULER_CLUSTER": cluster,
            "TIDEMQ_SCHEDULER_TOKEN": TOKEN, "TIDEMQ_SCHEDULER_DATA_DIR": str(self.sched_dir),
            "TIDEMQ_SCHEDULER_LOG_LEVEL": "warning",
        })
        self.url = f"http://127.0.0.1:{self.broker_port}"
        self.sched_url = f"http://127.0.0.1:{self.sched_port}"

    async def start(self) -> None:
        (self.workdir / "redis").mkdir(parents=True, exist_ok=True)
        for child in (self.redis, self.broker, self.scheduler):
            await asyncio.to_thread(child.start)
        await self.wait_ready()
        err.print(f"pids: broker {self.broker.pid}, scheduler {self.scheduler.pid}")

    async def wait_ready(self) -> None:
        async with httpx.AsyncClient(headers={"X-Tidemq-Token": TOKEN}) as http:
            for _ in range(400):
                resp = await http.get(f"{self.sched_url}/internal/v1/status")
                if resp.status_code == 200 and resp.json()["ready"]:
                    return
                await asyncio.sleep(0.05)
        raise TimeoutError("the scheduler did not connect to the broker")

    async def restart_scheduler(self) -> None:
        await asyncio.to_thread(self.scheduler.stop)
        await asyncio.to_thread(self.scheduler.start)
        await self.wait_ready()

    async def close(self) -> None:
        for child in (self.scheduler, self.broker, self.redis):
            await asyncio.to_thread(child.stop)

    def scheduler_rss(self) -> int:
        assert self.scheduler.pid is not None
        return int(psutil.Process(self.scheduler.pid).memory_info().rss)

    async def status(self, http: httpx.AsyncClient) -> dict[str, Any]:
        resp = await http.get(f"{self.sched_url}/internal/v1/status",
                              headers={"X-Tidemq-Token": TOKEN})
        answer: dict[str, Any] = resp.json()
        return answer


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


async def send_timers(http: httpx.AsyncClient, url: str, topic: str, prefix: str,
                      dues: array[int], batch: int, label: str) -> float:
    """Send one timer per due time (message id ``{prefix}{i}``); returns seconds taken."""
    began = time.perf_counter()
    n = len(dues)
    starts = list(range(0, n, batch))
    with progress() as bar:
        task = bar.add_task(label, total=n)

        async def sender(k: int) -> None:
            for s in starts[k::SENDERS]:
                msgs = [{"message_id": f"{prefix}{i}", "body": BODY, "deliver_at_ms": dues[i],
                         "queue_id": i % QUEUES} for i in range(s, min(n, s + batch))]
                body = msgpack.packb({"messages": msgs}, use_bin_type=True)
                while True:
                    resp = await http.post(f"{url}/v1/topics/{topic}/messages", content=body,
                                           headers=MSGPACK)
                    if resp.status_code == 200:
                        break
                    if resp.status_code != 503:
                        raise RuntimeError(f"send failed: {resp.status_code} {resp.text[:300]}")
                    await asyncio.sleep(0.05)
                bar.advance(task, len(msgs))

        await asyncio.gather(*(sender(k) for k in range(SENDERS)))
    return time.perf_counter() - began


class Collector:
    """Pulls every queue of a topic; records the store time of each timer by its index."""

    def __init__(self, url: str, topic: str, prefix: str, n: int) -> None:
        self.url, self.topic, self.prefix, self.n = url, topic, prefix, n
        self.stored = array("q", [0]) * n
        self.count = 0
        self.duplicates = 0
        self.done = asyncio.Event()

    async def run(self, http: httpx.AsyncClient, deadline: float) -> None:
        async def queue(qid: int) -> None:
            offset = 0
            cut = len(self.prefix)
            while not self.done.is_set() and time.monotonic() < deadline:
                resp = await http.get(
                    f"{self.url}/v1/topics/{self.topic}/queues/{qid}/messages",
                    params={"offset": offset, "max": 1024, "wait_ms": 500}, headers=MSGPACK)
                answer = msgpack.unpackb(resp.content, raw=False)
                for m in answer["messages"]:
                    i = int(m["message_id"][cut:])
                    if self.stored[i]:
                        self.duplicates += 1
                    else:
                        self.stored[i] = m["store_timestamp_ms"]
                        self.count += 1
                offset = answer["next_offset"]
                if self.count >= self.n:
                    self.done.set()

        await asyncio.gather(*(queue(q) for q in range(QUEUES)))


async def create_topic(http: httpx.AsyncClient, url: str) -> str:
    topic = f"Delays-{uuid.uuid4().hex[:6]}"
    resp = await http.put(f"{url}/v1/topics/{topic}", json={"queues": QUEUES})
    resp.raise_for_status()
    return topic


def pct(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


async def phase_lateness(c: Cluster, http: httpx.AsyncClient, sizes: Sizes) -> dict[str, Any]:
    topic = await create_topic(http, c.url)
    n = sizes.timers
    start = now_ms() + int(sizes.lead_s * 1000)
    step = sizes.spread_s * 1000 / n
    dues = array("q", (start + int(i * step) for i in range(n)))
    col = Collector(c.url, topic, "a", n)
    deadline = time.monotonic() + sizes.lead_s + sizes.spread_s + 120
    pull = asyncio.create_task(col.run(http, deadline))
    rss_peak = 0

    async def sample() -> None:
        nonlocal rss_peak
        while not col.done.is_set():
            rss_peak = max(rss_peak, c.scheduler_rss())
            await asyncio.sleep(0.5)

    sampler = asyncio.create_task(sample())
    send_s = await send_timers(http, c.url, topic, "a", dues, SEND_BATCH, "a: sending timers")
    err.print(f"a: sent {n:,} timers in {send_s:.1f}s; the first is due "
              f"{(start - now_ms()) / 1000:.1f}s from now, the last in "
              f"{(dues[-1] - now_ms()) / 1000:.0f}s")
    with progress() as bar:
        task = bar.add_task("a: delivered", total=n)
        while not col.done.is_set() and time.monotonic() < deadline:
            bar.update(task, completed=col.count)
            await asyncio.sleep(0.5)
        bar.update(task, completed=col.count)
    col.done.set()
    await pull
    await sampler
    late = [col.stored[i] - dues[i] for i in range(n) if col.stored[i]]
    early = sum(1 for x in late if x < 0)
    return {"timers": n, "delivered": col.count, "duplicates": col.duplicates, "early": early,
            "send_s": send_s, "p50_ms": pct(late, 0.50) if late else None,
            "p99_ms": pct(late, 0.99) if late else None,
            "max_ms": float(max(late)) if late else None,
            "mean_ms": statistics.fmean(late) if late else None, "rss_peak": rss_peak}


async def phase_burst(c: Cluster, http: httpx.AsyncClient, sizes: Sizes) -> dict[str, Any]:
    topic = await create_topic(http, c.url)
    n = sizes.burst
    base = int((await c.status(http))["pending_timers"])
    second = (now_ms() + int(sizes.burst_lead_s * 1000)) // 1000 * 1000
    dues = array("q", (second + (i * 997) % 1000 for i in range(n)))
    send_s = await send_timers(http, c.url, topic, "b", dues, SEND_BATCH, "b: sending burst")
    await taken_in(c, http, base + n, base, "b: taken in")
    ready_s = (second - now_ms()) / 1000
    err.print(f"b: {n:,} timers sent in {send_s:.1f}s and taken in; all due within the second "
              f"starting {ready_s:.1f}s from now")
    await drained(c, http, base)
    col = Collector(c.url, topic, "b", n)  # read back once delivered: no competing consumer
    await col.run(http, time.monotonic() + 120)
    stored = [s for s in col.stored if s]
    last = max(stored) if stored else None
    late = [col.stored[i] - dues[i] for i in range(n) if col.stored[i]]
    early = sum(1 for x in late if x < 0)
    return {"burst": n, "delivered": col.count, "duplicates": col.duplicates, "early": early,
            "ready_s": ready_s, "burst_s": (last - second) / 1000 if last else None,
            "first_s": (min(stored) - second) / 1000 if stored else None,
            "p99_ms": pct(late, 0.99) if late else None}


async def phase_rate(c: Cluster, http: httpx.AsyncClient, n: int, every_ms: int,
                     name: str) -> dict[str, Any]:
    """(d, e): ``n`` timers due ``every_ms`` apart (0: all at once), sent ahead and read back
    while they fall due."""
    topic = await create_topic(http, c.url)
    start = now_ms() + int(RATE_LEAD_S * 1000)
    dues = array("q", (start + i * every_ms for i in range(n)))
    col = Collector(c.url, topic, name, n)
    pull = asyncio.create_task(col.run(http, time.monotonic() + RATE_LEAD_S + 60))
    send_s = await send_timers(http, c.url, topic, name, dues, SEND_BATCH,
                               f"{name}: sending timers")
    err.print(f"{name}: sent {n:,} timers in {send_s:.1f}s; due from "
              f"{(start - now_ms()) / 1000:.1f}s from now, {every_ms} ms apart")
    await pull
    late = [col.stored[i] - dues[i] for i in range(n) if col.stored[i]]
    return {"timers": n, "delivered": col.count, "duplicates": col.duplicates,
            "early": sum(1 for x in late if x < 0),
            "p50_ms": pct(late, 0.50) if late else None,
            "p99_ms": pct(late, 0.99) if late else None,
            "max_ms": float(max(late)) if late else None}


async def phase_first(c: Cluster, http: httpx.AsyncClient, sizes: Sizes) -> dict[str, Any]:
    """(f): lateness of a level-1 message and a 1 s timer sent together to a new topic."""
    late: dict[str, list[int | None]] = {"level": [], "timer": []}  # per round (None: lost)
    for k in range(sizes.fresh):
        topic = await create_topic(http, c.url)
        resp = await http.post(f"{c.url}/v1/topics/{topic}/messages", json={"messages": [
            {"message_id": f"fl{k}", "body": "level 1", "delay_level": 1},
            {"message_id": f"ft{k}", "body": "1 s", "delay_ms": LEVEL_1_MS}]})
        resp.raise_for_status()
        due = {r["message_id"]: int(r["deliver_at_ms"]) for r in resp.json()["results"]}
        stored: dict[str, int] = {}
        deadline = time.monotonic() + LEVEL_1_MS / 1000 + 30
        while len(stored) < len(due) and time.monotonic() < deadline:
            await asyncio.sleep(FIRST_POLL_S)
            for qid in range(QUEUES):
                answer = (await http.get(f"{c.url}/v1/topics/{topic}/queues/{qid}/messages",
                                         params={"offset": 0})).json()
                stored.update((m["message_id"], m["store_timestamp_ms"])
                              for m in answer["messages"])
        for mid, kind in ((f"fl{k}", "level"), (f"ft{k}", "timer")):
            late[kind].append(stored[mid] - due[mid] if mid in stored else None)
    err.print(f"f: lateness (ms) of the first delays of {sizes.fresh} fresh topics: {late}")
    out: dict[str, Any] = {"rounds": sizes.fresh}
    for kind, values in late.items():
        seen = [x for x in values if x is not None]
        out[f"{kind}_first"] = values[0]
        out[f"{kind}_max"] = max(seen) if len(seen) == len(values) else None
    out["delivered"] = sum(x is not None for v in late.values() for x in v)
    out["early"] = sum(x is not None and x < 0 for v in late.values() for x in v)
    return out


async def steady_rss(c: Cluster, samples: int = 10, every_s: float = 0.2) -> float:
    """The scheduler's resident memory: the median of a few samples (the allocator makes it
    wander by a few MiB either way from one moment to the next)."""
    values = []
    for _ in range(samples):
        values.append(c.scheduler_rss())
        await asyncio.sleep(every_s)
    return float(statistics.median(values))


def slope(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of (timers, bytes): memory per added timer."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


async def phase_far(c: Cluster, http: httpx.AsyncClient, sizes: Sizes) -> dict[str, Any]:
    await c.restart_scheduler()  # a fresh process: memory from (a) and (b) does not count
    topic = await create_topic(http, c.url)
    # warm-up at full batch sizes and with the same spread: the one-time costs (HTTP buffers,
    # allocator arenas of the I/O threads, one open index file per hour bucket of the 30 days)
    # are paid before the first figure
    n_warm = max(250_000, sizes.far // 10)
    lo, span = now_ms() + 3_600_000, 30 * DAY_MS - 3_600_000 - 60_000
    warm = array("q", (lo + (i * 7_919_993 + 12_345) % span for i in range(n_warm)))
    await send_timers(http, c.url, topic, "w", warm, FAR_BATCH, "c: warm-up")
    base = await taken_in(c, http, n_warm, None, "")
    await asyncio.sleep(1.0)
    points = [(0, await steady_rss(c))]
    disk_before = dir_bytes(c.sched_dir)
    n = sizes.far
    dues = array("q", (lo + (i * 7_919_993) % span for i in range(n)))
    chunks = 4
    send_s = 0.0
    for k in range(chunks):  # the memory is sampled after each quarter is taken in
        part = dues[k * n // chunks:(k + 1) * n // chunks]
        send_s += await send_timers(http, c.url, topic, f"c{k}-", part, FAR_BATCH,
                                    f"c: far timers {k + 1}/{chunks}")
        await taken_in(c, http, base + (k + 1) * n // chunks, base, "c: taken in")
        points.append(((k + 1) * n // chunks, await steady_rss(c)))
    disk_after = dir_bytes(c.sched_dir)
    err.print("c: scheduler RSS (MiB) by far timers held: " + ", ".join(
        f"{x:,}: {y / 2**20:.1f}" for x, y in points))
    return {"far": n, "send_s": send_s, "rss_before": points[0][1], "rss_after": points[-1][1],
            "ram_per_timer": slope(points), "ram_per_timer_raw": (points[-1][1] - points[0][1]) / n,
            "disk_per_timer": (disk_after - disk_before) / n,
            "disk_bytes": disk_after - disk_before}


async def drained(c: Cluster, http: httpx.AsyncClient, pending: int) -> None:
    """Wait until the scheduler holds no more than ``pending`` timers (the rest delivered)."""
    while True:
        if int((await c.status(http))["pending_timers"]) <= pending:
            return
        await asyncio.sleep(0.25)


async def taken_in(c: Cluster, http: httpx.AsyncClient, target: int, base: int | None,
                   label: str) -> int:
    """Wait until the scheduler holds ``target`` pending timers; returns the count."""
    with progress() as bar:
        task = bar.add_task(label or "taken in", total=target - (base or 0))
        while True:
            pending = int((await c.status(http))["pending_timers"])
            bar.update(task, completed=pending - (base or 0))
            if pending >= target:
                return pending
            await asyncio.sleep(0.5)


async def run_all(tmp: Path, sizes: Sizes, only: set[str]) -> dict[str, Any]:
    c = Cluster(tmp)
    await c.start()
    res: dict[str, Any] = {}
    try:
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=64)) as h:
            if "f" in only:  # first: nothing was delayed on this broker or scheduler yet
                res["f"] = await phase_first(c, h, sizes)
            if "a" in only:
                res["a"] = await phase_lateness(c, h, sizes)
            if "d" in only:
                res["d"] = await phase_rate(c, h, RATE_TIMERS, 1, "d")
            if "e" in only:
                res["e"] = await phase_rate(c, h, TOGETHER_TIMERS, 0, "e")
            if "b" in only:
                res["b"] = await phase_burst(c, h, sizes)
            if "c" in only:
                res["c"] = await phase_far(c, h, sizes)
    finally:
        await c.close()
    return res


def build_rows(res: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    a, b, f, first = res.get("a"), res.get("b"), res.get("c"), res.get("f")
    d, e = res.get("d"), res.get("e")
    if first:
        rows += [first_row(first, kind, what) for kind in ("level", "timer")
                 for what in ("first", "max")]
        rows.append(Row("f. delivered / early", first["delivered"], "messages",
                        target=f"all {2 * first['rounds']}, 0 early ({first['early']})",
                        met=first["delivered"] == 2 * first["rounds"] and not first["early"]))
    if a:
        rows += [*lateness_rows("a.", f"({a['timers']:,} timers)", a, TARGET_P99_MS),
                 Row("a. scheduler RSS (peak)", a["rss_peak"] / 2**20, "MiB")]
    if b:
        rows += [
            Row(f"b. burst of {b['burst']:,} due in one second", b["burst_s"], "s",
                target=f"<= {TARGET_BURST_S:.0f} s",
                met=b["burst_s"] is not None and b["burst_s"] <= TARGET_BURST_S
                and b["delivered"] == b["burst"]),
            p99_row("b. burst: lateness p99", b, TARGET_BURST_P99_MS),
            delivered_row("b.", b, b["burst"]),
        ]
    if e:
        rows += [
            Row(f"e. {e['timers']:,} due at one moment: lateness p50", e["p50_ms"], "ms"),
            p99_row("e. lateness p99", e, TARGET_BURST_P99_MS),
            delivered_row("e.", e, e["timers"]),
        ]
    if d:
        rows += lateness_rows("d.", f"({d['timers']:,} timers at 1 k/s)", d, TARGET_RATE_P99_MS)
    if f:
        rows += [
            Row(f"c. RAM per far timer ({f['far']:,}; slope)", f["ram_per_timer"], "bytes",
                target=f"<= {TARGET_RAM_PER_TIMER:.0f} byte",
                met=f["ram_per_timer"] <= TARGET_RAM_PER_TIMER),
            Row("c. RAM per far timer (last - first)", f["ram_per_timer_raw"], "bytes"),
            Row("c. disk per far timer", f["disk_per_timer"], "bytes"),
            Row("c. scheduler RSS before / after", f["rss_after"] / 2**20, "MiB",
                target=f"before {f['rss_before'] / 2**20:.1f} MiB"),
            Row("c. send rate (4096 per request)", f["far"] / f["send_s"], "timers/s"),
        ]
    return rows


def lateness_rows(phase: str, what: str, r: dict[str, Any], target_ms: float) -> list[Row]:
    """A phase's lateness p50, p99 (against its target) and max, and its timers delivered."""
    return [Row(f"{phase} lateness p50 {what}", r["p50_ms"], "ms"),
            p99_row(f"{phase} lateness p99", r, target_ms),
            Row(f"{phase} lateness max", r["max_ms"], "ms"),
            delivered_row(phase, r, r["timers"])]


def p99_row(label: str, r: dict[str, Any], target_ms: float) -> Row:
    """A phase's lateness p99 against its target."""
    return Row(label, r["p99_ms"], "ms", target=f"<= {target_ms:.0f} ms",
               met=r["p99_ms"] is not None and r["p99_ms"] <= target_ms)


def delivered_row(phase: str, r: dict[str, Any], total: int) -> Row:
    """A phase's timers delivered, none early, none twice."""
    return Row(f"{phase} delivered / early / duplicates", r["delivered"], "timers",
               target=f"all, 0 early ({r['early']}), 0 dup ({r['duplicates']})",
               met=r["delivered"] == total and not r["early"] and not r["duplicates"])


def first_row(first: dict[str, Any], kind: str, what: str) -> Row:
    """(f) one figure: the first round's or the worst round's lateness of ``kind``."""
    value = first[f"{kind}_{what}"]
    name = "level 1" if kind == "level" else "1 s timer"
    label = (f"f. first {name} of a fresh system" if what == "first"
             else f"f. {name} on a fresh topic (worst of {first['rounds']})")
    return Row(label, value, "ms", target=f"0 - {TARGET_FIRST_MS:.0f} ms",
               met=value is not None and 0 <= value <= TARGET_FIRST_MS)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.delays", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the smaller sizes (about 2 minutes)")
    ap.add_argument("--json", action="store_true",
                    help="print one JSON object with every figure as the last line of stdout")
    ap.add_argument("--only", default="fadebc", help="phases to run, e.g. 'b' or 'fa'")
    ap.add_argument("--dir", default=None, help="parent of the scratch directory (default: /tmp)")
    args = ap.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    loop = loop_name()
    err.print(f"delays bench ({'quick' if args.quick else 'full'}), event loop: {loop}")
    began = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="tidemq-delays-bench-", dir=args.dir))
    try:
        res = run(run_all(tmp, sizes, set(args.only)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    total = time.perf_counter() - began
    print_table(f"tidemq delays bench ({'quick' if args.quick else 'full'})", build_rows(res),
                caption=f"{os.cpu_count()} CPUs, {loop}, {total:.0f} s in all; lateness = "
                        "store time of the delivered copy - deliver_at_ms")
    if args.json:
        a, b, f = res.get("a") or {}, res.get("b") or {}, res.get("c") or {}
        first = res.get("f") or {}
        print_json({
            "bench": "delays", "quick": args.quick, "event_loop": loop,
            "lateness_p50_ms": a.get("p50_ms"), "lateness_p99_ms": a.get("p99_ms"),
            "lateness_max_ms": a.get("max_ms"), "timers": a.get("timers"),
            "timers_early": a.get("early"), "scheduler_rss_peak_bytes": a.get("rss_peak"),
            "burst_s": b.get("burst_s"), "burst_size": b.get("burst"),
            "burst_early": b.get("early"), "burst_p99_ms": b.get("p99_ms"),
            "rate_1k_p50_ms": (res.get("d") or {}).get("p50_ms"),
            "rate_1k_p99_ms": (res.get("d") or {}).get("p99_ms"),
            "rate_1k_max_ms": (res.get("d") or {}).get("max_ms"),
            "together_p99_ms": (res.get("e") or {}).get("p99_ms"),
            "together_max_ms": (res.get("e") or {}).get("max_ms"),
            "ram_bytes_per_far_timer": f.get("ram_per_timer"),
            "disk_bytes_per_far_timer": f.get("disk_per_timer"), "far_timers": f.get("far"),
            "first_level_1_late_ms": first.get("level_first"),
            "first_timer_1s_late_ms": first.get("timer_first"),
            "fresh_topic_level_1_late_max_ms": first.get("level_max"),
            "fresh_topic_timer_1s_late_max_ms": first.get("timer_max"),
            "seconds": round(total, 1),
        })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
