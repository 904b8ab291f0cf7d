"""Produce / consume benchmark: tidemq through its SDK against Redis Streams and NATS JetStream.

Run ``python -m bench.produce_consume [--quick] [--json] [--profile DIR] [--otel]``
(``--otel``: after tidemq's rows, its produce and consume phases in interleaved rounds with
OpenTelemetry tracing off and on, and the overhead; bench/_otel.py).

Every system gets the same workload of 1 KiB messages, on servers the bench starts on free
ports (data in a temp dir) and stops at the end:

1. produce   64 concurrent senders share N messages (quick 20k, full 200k).
             tidemq: ``await producer.send(body)`` per message (the SDK coalesces concurrent
             sends, ``linger_ms=1``); extra row: each sender keeps 16 sends in flight.
             Redis Streams: each sender runs pipelines of 16 XADDs (redis-py asyncio).
             NATS JetStream: each sender keeps 16 ``publish_async`` acks in flight.
2. consume   read all N back. tidemq: a ``PushConsumer`` in clustering mode (one instance,
             every queue); extra row: a raw pull loop over REST msgpack (httpx, no SDK).
             Redis: XREADGROUP + XACK readers. NATS: pull-subscription ``fetch`` + ``ack``.
3. latency   a steady 1,000 msg/s, then 10,000 msg/s, for 3 s (quick) / 15 s (full) each after
             a warm-up whose samples are dropped; each body starts with its send time
             (``perf_counter_ns``, same process), the consumer's receive time minus it is the
             end-to-end latency. tidemq: a producer and a consumer of its own, whose transports
             note where each message's milliseconds go (bench/_breakdown.py); the table prints
             that breakdown for the 1,000 msg/s run.

CPU per message, each side: the client is this process (``time.process_time``), the server the
broker process (tidemq; not its nameserver or Redis), ``redis-server`` or ``nats-server``
(psutil), over each throughput phase, divided by its messages.

tidemq runs nameserver + broker (``flush=async``) + its own redis-server; the Redis Streams peer
has a separate redis-server with ``appendonly yes`` / ``appendfsync everysec`` (the durability
closest to ``flush=async``); NATS runs ``nats-server -js -sd <tmp>`` (file storage). Redis
runs through redis-py with hiredis. Peers missing a part are installed first
(bench/install-peers.sh); a peer that still cannot run fails the bench (exit status 2) unless
``--no-peers``. Targets (issue 23): tidemq produce and consume >= 2x Redis Streams and >= 1x NATS
JetStream, p99 <= 5 ms at 1,000 msg/s and <= 10 ms at 10,000 msg/s.

``--gc-freeze`` calls ``gc.freeze()`` once the producer has started (docs/scaling.md, "A
long-lived producer and the garbage collector"); either way the caption says how much of the
client's CPU per message went to the cyclic GC in the produce phases (``gc.callbacks``).

``--profile DIR`` samples the broker and this process with py-spy (when installed) during the
tidemq produce, consume and latency phases and writes collapsed stacks (``*.txt``) there, with
a short summary of the hottest frames on stderr; figures of a profiled run are a little slower.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import _otel
from bench._breakdown import SEGMENTS, Timings, TimingTransport, summary
from bench._common import Row, err, loop_name, print_json, print_table, run
from bench._peers import (
    BODY_BYTES,
    STAMP,
    Counter,
    Latency,
    NatsPeer,
    RedisStreamsPeer,
    Throughput,
    ensure_peers,
    free_port,
    make_bodies,
    paced_latency,
    python_service,
    redis_server,
    run_senders,
    stamp_of,
    timed,
    with_server_cpu,
)
from bench.sdk_send import GC

SENDERS = 64
SEGMENT_DOC = {  # the latency breakdown's segments (bench/_breakdown.py)
    "queue": "send() to request out", "http_send": "request to broker route",
    "store": "route to stored + dispatched", "wake": "dispatch to held pull resumed",
    "answer": "pull resumed to answer built", "pull_ret": "answer to consumer's client",
    "handler": "client to handler", "total": "send() to handler",
}
WINDOW = 16  # peers' pipeline / in-flight depth per sender; the tidemq extra row's too
QUEUES = 8
RATE = 1000.0
RATE_HIGH = 10_000.0
TARGET_PRODUCE = 2.0  # x Redis Streams
TARGET_CONSUME = 2.0
TARGET_VS_NATS = 1.0  # produce and consume x NATS JetStream
TARGET_P99_MS = 5.0  # at RATE
TARGET_P99_HIGH_MS = 10.0  # at RATE_HIGH
PULL_BATCH = 256  # PushConsumer pull_batch in the consume phase
CONCURRENCY = 64  # PushConsumer max_concurrency in the consume phase
RAW_PULL_MAX = 1024


@dataclass(frozen=True, slots=True)
class Sizes:
    messages: int
    latency_s: float
    warmup_s: float


PEERS: list[tuple[str, type[Any]]] = [("redis", RedisStreamsPeer), ("nats", NatsPeer)]
QUICK = Sizes(messages=20_000, latency_s=3.0, warmup_s=0.5)
FULL = Sizes(messages=200_000, latency_s=15.0, warmup_s=1.0)


class Sink:
    """What every consumer does with a message: count its bytes (all systems alike)."""

    def __init__(self) -> None:
        self.bytes = 0

    def __call__(self, body: bytes) -> None:
        self.bytes += len(body)


# --- profiling (py-spy) ----------------------------------------------------------------------
class Profiler:
    def __init__(self, out_dir: Path | None) -> None:
        self.out_dir = out_dir
        self.exe = shutil.which("py-spy") or (
            str(Path(sys.executable).parent / "py-spy")
            if (Path(sys.executable).parent / "py-spy").exists() else None)
        self.files: list[Path] = []
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            if self.exe is None:
                err.print("[yellow]--profile: py-spy is not installed (pip install py-spy); "
                          "no profiles taken[/]")

    @contextmanager
    def phase(self, name: str, pids: dict[str, int | None]) -> Iterator[None]:
        if self.out_dir is None or self.exe is None:
            yield
            return
        procs = []
        for who, pid in pids.items():
            if pid is None:
                continue
            path = self.out_dir / f"{name}-{who}.txt"
            p = subprocess.Popen([self.exe, "record", "--format", "raw", "--rate", "250",
                                  "--nonblocking", "-o", str(path), "--pid", str(pid)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append((p, path))
        time.sleep(0.5)  # let py-spy attach
        try:
            yield
        finally:
            for p, _ in procs:
                p.send_signal(signal.SIGINT)
            for p, path in procs:
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
                if path.exists():
                    self.files.append(path)

    def summary(self, top: int = 25) -> None:
        for path in self.files:
            own: collections.Counter[str] = collections.Counter()
            total = 0
            for line in path.read_text(errors="replace").splitlines():
                stack, _, count = line.rpartition(" ")
                if not count.isdigit():
                    continue
                n = int(count)
                total += n
                leaf = stack.rsplit(";", 1)[-1]
                own[leaf] += n
            err.print(f"\n===== py-spy {path.name}: {total} samples, hottest leaf frames =====")
            for frame, n in own.most_common(top):
                err.print(f"{100 * n / max(1, total):5.1f}%  {frame}")


# --- tidemq ----------------------------------------------------------------------------------
class Tidemq:
    name = "tidemq"

    def __init__(self, workdir: Path, gc_freeze: bool = False) -> None:
        self.workdir = workdir
        self.gc_freeze = gc_freeze  # gc.freeze() once the producer has started
        self.cluster = f"bench-{uuid.uuid4().hex[:8]}"
        self.redis = redis_server(workdir / "redis-state", appendonly=True)
        self.ns_port, self.broker_port = free_port(), free_port()
        self.nameserver = python_service("nameserver", self.ns_port, workdir, {
            "TIDEMQ_NAMESRV_PORT": str(self.ns_port), "TIDEMQ_NAMESRV_LOG_LEVEL": "warning"})
        self.broker = python_service("broker", self.broker_port, workdir, {
            "TIDEMQ_BROKER_PORT": str(self.broker_port),
            "TIDEMQ_BROKER_DATA_DIR": str(workdir / "broker-data"),
            "TIDEMQ_BROKER_REDIS_URL": f"redis://127.0.0.1:{self.redis.port}/0",
            "TIDEMQ_BROKER_NAMESERVERS": f"http://127.0.0.1:{self.ns_port}",
            "TIDEMQ_BROKER_CLUSTER": self.cluster,
            "TIDEMQ_BROKER_FLUSH": "async",
            "TIDEMQ_BROKER_LOG_LEVEL": "warning",
        })
        self.producer: Any = None
        self.timings = Timings()  # the latency phase's breakdown stamps

    @property
    def ns_url(self) -> str:
        return f"http://127.0.0.1:{self.ns_port}"

    @property
    def broker_url(self) -> str:
        return f"http://127.0.0.1:{self.broker_port}"

    async def start(self) -> None:
        from tidemq import Producer

        (self.workdir / "redis-state").mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(self.redis.start)
        await asyncio.to_thread(self.nameserver.start)
        await asyncio.to_thread(self.broker.start)
        self.producer = Producer(nameservers=[self.ns_url])
        await self.producer.start()
        if self.gc_freeze:
            gc.collect()
            gc.freeze()

    async def close(self) -> None:
        if self.producer is not None:
            await self.producer.close()
        for child in (self.broker, self.nameserver, self.redis):
            await asyncio.to_thread(child.stop)

    async def create_topic(self, topic: str) -> None:
        import httpx

        async with httpx.AsyncClient(timeout=10) as http:
            r = await http.put(f"{self.broker_url}/v1/topics/{topic}", json={"queues": QUEUES})
            r.raise_for_status()

    async def queue_ends(self, topic: str) -> dict[int, int]:
        import httpx

        async with httpx.AsyncClient(timeout=10) as http:
            r = await http.get(f"{self.broker_url}/v1/topics/{topic}")
            r.raise_for_status()
            return {int(o["queue_id"]): int(o["max"]) for o in r.json()["offsets"]}

    async def produce(self, topic: str, n: int, senders: int, window: int,
                      bodies: list[bytes]) -> Throughput:
        await self.create_topic(topic)
        send = self.producer.send

        async def send_window(batch: list[bytes]) -> None:
            if len(batch) == 1:
                await send(batch[0], topic=topic)
            else:
                await asyncio.gather(*(send(b, topic=topic) for b in batch))

        label = (f"tidemq: {senders} senders x await send" if window == 1 else
                 f"tidemq: {senders} senders x {window} sends in flight")
        requests0 = self.producer._coalescer.requests_sent
        gc0 = GC.spent_s
        res = await run_senders(n, senders, window, bodies, send_window, label)
        res.extra["client_gc_us_per_msg"] = (GC.spent_s - gc0) / n * 1e6
        requests = self.producer._coalescer.requests_sent - requests0
        stored = sum((await self.queue_ends(topic)).values())
        if stored != n:
            raise RuntimeError(f"tidemq: {topic} holds {stored} messages, expected {n}")
        res.extra["msgs_per_request"] = n / max(1, requests)
        return res

    async def consume(self, topic: str, n: int, handle: Callable[[bytes], None]) -> Throughput:
        from tidemq import PushConsumer

        counter = Counter(n)

        async def handler(message: Any) -> None:
            handle(message.body)
            counter.add()

        consumer = PushConsumer(f"bench-{uuid.uuid4().hex[:6]}", nameservers=[self.ns_url],
                                handler=handler, pull_batch=PULL_BATCH,
                                max_concurrency=CONCURRENCY, consume_from="first")
        consumer.subscribe(topic)

        async def work() -> None:
            await consumer.start()
            await counter.done.wait()

        try:
            elapsed, cpu = await timed(f"tidemq: PushConsumer (pull_batch={PULL_BATCH}, "
                                       f"max_concurrency={CONCURRENCY})", n,
                                       lambda: counter.n, work())
        finally:
            await consumer.close()
        return Throughput(counter.n, elapsed, cpu)

    async def raw_pull(self, topic: str, n: int, handle: Callable[[bytes], None]) -> Throughput:
        """Every queue read with plain ``GET .../messages`` in msgpack; no SDK, no handler."""
        import httpx
        import msgpack

        ends = await self.queue_ends(topic)
        got = 0

        async def read_queue(http: httpx.AsyncClient, qid: int, end: int) -> None:
            nonlocal got
            offset = 0
            target = f"{self.broker_url}/v1/topics/{topic}/queues/{qid}/messages"
            while offset < end:
                r = await http.get(target, params={"offset": offset, "max": RAW_PULL_MAX},
                                   headers={"accept": "application/msgpack"})
                r.raise_for_status()
                answer = msgpack.unpackb(r.content, raw=False)
                for m in answer["messages"]:
                    handle(m["body"])
                got += len(answer["messages"])
                offset = answer["next_offset"]

        async def work() -> None:
            async with httpx.AsyncClient(timeout=30) as http:
                await asyncio.gather(*(read_queue(http, q, e) for q, e in ends.items()))

        elapsed, cpu = await timed(f"tidemq: raw REST pull loop (msgpack, max={RAW_PULL_MAX})",
                                   n, lambda: got, work())
        if got != n:
            raise RuntimeError(f"tidemq raw pull: read {got} of {n}")
        return Throughput(got, elapsed, cpu)

    async def latency(self, rate: float, duration_s: float, warmup_s: float,
                      pad: bytes) -> Latency:
        from tidemq import Producer, PushConsumer

        topic = f"BenchLatency{rate:.0f}"
        await self.create_topic(topic)
        received: list[tuple[int, int]] = []
        pending: set[asyncio.Task[Any]] = set()
        timings = self.timings if rate == RATE else Timings()  # the breakdown: RATE's run
        handled = timings.handled

        async def handler(message: Any) -> None:
            now = time.perf_counter_ns()
            sent = stamp_of(message.body)
            received.append((sent, now))
            handled[message.message_id] = (sent, now)

        # own clients, their transports noting the breakdown's stamps (bench/_breakdown.py)
        consumer = PushConsumer(f"bench-latency-{rate:.0f}", nameservers=[self.ns_url],
                                handler=handler, consume_from="first",
                                transport=TimingTransport(timings))
        consumer.subscribe(topic)
        await consumer.start()
        producer = Producer(nameservers=[self.ns_url], transport=TimingTransport(timings))
        await producer.start()
        send = producer.send

        def fire(body: bytes) -> None:
            task = asyncio.create_task(send(body, topic=topic))
            pending.add(task)
            task.add_done_callback(pending.discard)

        try:
            return await paced_latency(rate, duration_s, warmup_s, fire, received,
                                       f"tidemq: latency at {rate:,.0f} msg/s", pad)
        finally:
            await asyncio.gather(*pending, return_exceptions=True)
            await consumer.close()
            await producer.close()


# --- the run ---------------------------------------------------------------------------------
def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


async def run_peer(peer: Any, sizes: Sizes, bodies: list[bytes], pad: bytes,
                   results: dict[str, Any], key: str) -> None:
    sink = Sink()
    await peer.start(SENDERS)
    try:
        r = results[key] = {"describe": peer.describe()}
        n, pids = sizes.messages, peer.pids
        r["produce_await"] = (await with_server_cpu(pids, peer.produce(n, SENDERS, 1, bodies))
                              ).as_dict()
        r["produce"] = (await with_server_cpu(pids, peer.produce(n, SENDERS, WINDOW, bodies))
                        ).as_dict()
        r["consume"] = (await with_server_cpu(pids, peer.consume(n, sink))).as_dict()
        r["latency"] = (await peer.latency(RATE, sizes.latency_s, sizes.warmup_s, pad)
                        ).as_dict()
        r["latency_10k"] = (await peer.latency(RATE_HIGH, sizes.latency_s, sizes.warmup_s,
                                               pad)).as_dict()
    finally:
        await peer.close()
    if sink.bytes != sizes.messages * BODY_BYTES:
        raise RuntimeError(f"{peer.name}: consumed {sink.bytes} bytes, expected "
                           f"{sizes.messages * BODY_BYTES}")


async def run_tidemq(tmp: Path, sizes: Sizes, bodies: list[bytes], pad: bytes,
                     prof: Profiler, results: dict[str, Any], otel: bool = False,
                     gc_freeze: bool = False) -> None:
    t = Tidemq(tmp / "tidemq", gc_freeze)
    n = sizes.messages
    await t.start()
    try:
        import tidemq

        results["tidemq"] = {"describe": f"tidemq SDK {tidemq.__version__}: nameserver + broker "
                                         "(flush=async), msgpack over HTTP/1.1"}
        r = results["tidemq"]
        pids = {"broker": t.broker.pid, "client": os.getpid()}
        server = [t.broker.pid]
        with prof.phase("produce-await", pids):
            r["produce_await"] = (await with_server_cpu(server, t.produce(
                "BenchTP1", n, SENDERS, 1, bodies))).as_dict()
        with prof.phase("produce", pids):
            r["produce"] = (await with_server_cpu(server, t.produce(
                "BenchTP", n, SENDERS, WINDOW, bodies))).as_dict()
        sink = Sink()
        with prof.phase("consume", pids):
            r["consume"] = (await with_server_cpu(server, t.consume("BenchTP", n, sink))
                            ).as_dict()
        if sink.bytes != n * BODY_BYTES:
            raise RuntimeError(f"tidemq: consumed {sink.bytes} bytes, expected {n * BODY_BYTES}")
        r["raw_pull"] = (await with_server_cpu(server, t.raw_pull("BenchTP", n, Sink()))
                         ).as_dict()
        with prof.phase("latency", pids):
            r["latency"] = (await t.latency(RATE, sizes.latency_s, sizes.warmup_s,
                                            pad)).as_dict()
        r["latency_breakdown"] = summary(t.timings, r["latency"]["samples"])
        r["latency_10k"] = (await t.latency(RATE_HIGH, sizes.latency_s, sizes.warmup_s,
                                            pad)).as_dict()
        if otel:
            r["otel"] = await _otel.measure(t, n, bodies, SENDERS, WINDOW)
    finally:
        await t.close()


async def run_all(tmp: Path, sizes: Sizes, prof: Profiler, peers_too: bool,
                  otel: bool = False, gc_freeze: bool = False) -> dict[str, Any]:
    bodies = make_bodies(7)
    pad = make_bodies(8, 1)[0][: BODY_BYTES - STAMP]
    results: dict[str, Any] = {"skipped": {}, "loadavg": {"before": os.getloadavg()[0]}}
    gc.callbacks.append(GC)
    try:
        await run_tidemq(tmp, sizes, bodies, pad, prof, results, otel, gc_freeze)
    finally:
        gc.callbacks.remove(GC)
    for key, cls in PEERS:
        if not peers_too:
            results["skipped"][key] = "--no-peers"
            continue
        try:
            await run_peer(cls(tmp / key), sizes, bodies, pad, results, key)
        except Exception as exc:  # reported in the table and the exit status
            results.pop(key, None)
            results["skipped"][key] = f"failed: {type(exc).__name__}: {exc}"
            err.print(f"[red]{cls.name}: failed: {exc!r}[/]")
    results["loadavg"]["after"] = os.getloadavg()[0]
    return results


def fig(results: dict[str, Any], system: str, phase: str, key: str) -> float | None:
    value = results.get(system, {}).get(phase, {}).get(key)
    return float(value) if value is not None else None


def build_rows(res: dict[str, Any]) -> list[Row]:
    skip = res["skipped"]
    t = {k: fig(res, "tidemq", k, "msgs_per_s") for k in
         ("produce", "produce_await", "consume", "raw_pull")}
    t50, t99 = fig(res, "tidemq", "latency", "p50_ms"), fig(res, "tidemq", "latency", "p99_ms")
    peers = (("redis", "Redis Streams"), ("nats", "NATS JetStream"))
    targets = {"redis": None, "nats": TARGET_VS_NATS}

    def peer_row(key: str, label: str, value: float | None, unit: str = "msgs/s") -> Row:
        if key in skip:
            return Row(f"{label} (not measured: {skip[key]})", None, unit)
        return Row(label, value, unit)

    def ratio_rows(what: str, ours: float | None, phase: str, target: float | None) -> list[Row]:
        rows = []
        for key, name in peers:
            theirs = fig(res, key, phase, "msgs_per_s")
            r = ratio(ours, theirs)
            goal = (target if key == "redis" else targets[key]) if target is not None else None
            if goal is not None:
                rows.append(Row(f"{what}: tidemq / {name}", None, "", r, f">= {goal:.0f}x",
                                None if r is None else r >= goal))
            else:
                rows.append(Row(f"{what}: tidemq / {name}", None, "", r))
        return rows

    def cpu_rows(phase: str, what: str) -> list[Row]:
        rows = []
        for key, name in (("tidemq", "tidemq"), *peers):
            if key in skip:
                continue
            client = fig(res, key, phase, "client_us_per_msg")
            server = fig(res, key, phase, "server_us_per_msg")
            side = "broker" if key == "tidemq" else "server"
            rows.append(Row(f"  CPU per message, {what}: {name} client / {side}", client,
                            "µs", target="" if server is None else f"{side} {server:.1f} µs"))
        return rows

    w = WINDOW
    rows = [
        Row(f"tidemq produce: SDK send, {SENDERS} senders x {w} in flight (1 KiB)",
            t["produce"], "msgs/s"),
        peer_row("redis", f"Redis Streams produce: {SENDERS} senders x {w}-XADD pipelines",
                 fig(res, "redis", "produce", "msgs_per_s")),
        peer_row("nats", f"NATS JetStream produce: {SENDERS} senders x {w} publish_async "
                 "in flight", fig(res, "nats", "produce", "msgs_per_s")),
        *ratio_rows(f"produce ratio ({w} in flight per sender)", t["produce"], "produce",
                    TARGET_PRODUCE),
        *cpu_rows("produce", f"produce ({w} in flight)"),
        Row(f"tidemq produce: {SENDERS} senders x await send (1 in flight; SDK coalesces)",
            t["produce_await"], "msgs/s"),
        peer_row("redis", f"Redis Streams produce: {SENDERS} senders x await XADD",
                 fig(res, "redis", "produce_await", "msgs_per_s")),
        peer_row("nats", f"NATS JetStream produce: {SENDERS} senders x await publish_async",
                 fig(res, "nats", "produce_await", "msgs_per_s")),
        *ratio_rows("produce ratio (1 in flight per sender)", t["produce_await"],
                    "produce_await", None),
        Row(f"tidemq consume: PushConsumer, clustering (pull_batch={PULL_BATCH}, "
            f"max_concurrency={CONCURRENCY})", t["consume"], "msgs/s"),
        Row(f"tidemq consume: raw REST pull loop, msgpack, max={RAW_PULL_MAX} (no SDK)",
            t["raw_pull"], "msgs/s"),
        peer_row("redis", "Redis Streams consume: XREADGROUP x500 + XACK, 2 readers",
                 fig(res, "redis", "consume", "msgs_per_s")),
        peer_row("nats", "NATS JetStream consume: fetch x256 + ack", fig(res, "nats", "consume",
                                                                         "msgs_per_s")),
        *ratio_rows("consume ratio (PushConsumer)", t["consume"], "consume", TARGET_CONSUME),
        *ratio_rows("consume ratio (raw pull loop)", t["raw_pull"], "consume", None),
        *cpu_rows("consume", "consume (PushConsumer)"),
        Row(f"tidemq e2e latency p50 at {RATE:,.0f} msg/s", t50, "ms"),
        Row(f"tidemq e2e latency p99 at {RATE:,.0f} msg/s", t99, "ms", target=f"<= "
            f"{TARGET_P99_MS:.0f} ms", met=None if t99 is None else t99 <= TARGET_P99_MS),
    ]
    breakdown = res.get("tidemq", {}).get("latency_breakdown", {})
    for seg in (*SEGMENTS, "total"):
        b = breakdown.get(seg)
        if b is not None:
            rows.append(Row(f"  tidemq latency breakdown: {seg} p50 / p99 ({SEGMENT_DOC[seg]})",
                            b["p50_ms"], "ms", target="" if b["p99_ms"] is None else
                            f"p99 {b['p99_ms']:.2f} ms"))
    h50, h99 = (fig(res, "tidemq", "latency_10k", "p50_ms"),
                fig(res, "tidemq", "latency_10k", "p99_ms"))
    rows.append(Row(f"tidemq e2e latency p50 at {RATE_HIGH:,.0f} msg/s", h50, "ms"))
    rows.append(Row(f"tidemq e2e latency p99 at {RATE_HIGH:,.0f} msg/s", h99, "ms",
                    target=f"<= {TARGET_P99_HIGH_MS:.0f} ms",
                    met=None if h99 is None else h99 <= TARGET_P99_HIGH_MS))
    for key, name in peers:
        if key in skip:
            rows.append(Row(f"{name} e2e latency (not measured: {skip[key]})", None, "ms"))
            continue
        for phase, rate in (("latency", RATE), ("latency_10k", RATE_HIGH)):
            rows.append(Row(f"{name} e2e latency p50 / p99 at {rate:,.0f} msg/s",
                            fig(res, key, phase, "p50_ms"), "ms",
                            target=f"p99 {fig(res, key, phase, 'p99_ms') or 0:.2f} ms"))
    return rows


def caption(res: dict[str, Any], sizes: Sizes, loop: str, total_s: float) -> str:
    load = res.get("loadavg", {})
    notes = [f"{sizes.messages:,} messages of {BODY_BYTES} B per throughput phase; latency "
             f"{sizes.latency_s:.0f} s at {RATE:,.0f} msg/s after a {sizes.warmup_s} s warm-up; "
             f"client: one process, event loop {loop}; {os.cpu_count()} CPUs (servers share "
             f"them); total {total_s:.0f} s; load average (1 min) {load.get('before', 0):.1f} "
             f"before, {load.get('after', 0):.1f} after (anything else running skews the "
             "figures)"]
    for key in ("tidemq", "redis", "nats"):
        if key in res and "describe" in res[key]:
            notes.append(f"{key}: {res[key]['describe']}")
    t = res.get("tidemq", {})
    if t:
        notes.append(
            f"tidemq: {t['produce'].get('msgs_per_request', 0):.0f} / "
            f"{t['produce_await'].get('msgs_per_request', 0):.0f} msgs per send request "
            f"({WINDOW} / 1 in flight per sender); client CPU produce "
            f"{t['produce']['client_cpu_util']:.0%}, consume "
            f"{t['consume']['client_cpu_util']:.0%}; latency samples "
            f"{t['latency']['samples']:,} (received {t['latency']['received']:,} of "
            f"{t['latency']['sent']:,}), max {t['latency']['max_ms'] or 0:.1f} ms; cyclic GC "
            f"per message produced {t['produce'].get('client_gc_us_per_msg', 0):.2f} / "
            f"{t['produce_await'].get('client_gc_us_per_msg', 0):.2f} µs of the client's CPU "
            f"({WINDOW} / 1 in flight), gc.freeze {'on' if res.get('gc_freeze') else 'off'}")
    notes.append("ratio rows: tidemq's figure / the peer's for the same workload; the targets "
                 f"compare the {WINDOW}-in-flight produce (the peers' pipelined shape) and the "
                 "PushConsumer")
    return "\n".join(notes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.produce_consume", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="20k messages, 3 s latency phase")
    ap.add_argument("--json", action="store_true",
                    help="print one JSON object with every figure as the last line of stdout")
    ap.add_argument("--profile", metavar="DIR", default=None,
                    help="py-spy the broker and this process during tidemq produce/consume")
    ap.add_argument("--messages", type=int, default=None, help="override the message count")
    ap.add_argument("--no-peers", action="store_true", help="tidemq only (profiling runs)")
    ap.add_argument("--dir", default=None, help="parent of the scratch directory (default: /tmp)")
    ap.add_argument("--gc-freeze", action="store_true",
                    help="gc.freeze() in this process once the producer has started")
    ap.add_argument("--otel", action="store_true",
                    help="also run tidemq's produce/consume with OpenTelemetry tracing on and "
                         "print the overhead (bench/_otel.py)")
    args = ap.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.messages:
        sizes = Sizes(args.messages, sizes.latency_s, sizes.warmup_s)
    if not args.no_peers:  # the peers run in the same run: install what they miss first
        missing = ensure_peers([cls for _, cls in PEERS])
        if missing:
            for name, why in missing.items():
                err.print(f"[red]{name} cannot run: {why}[/]")
            err.print("[red]the peers are part of this bench; --no-peers runs tidemq alone[/]")
            return 2
    loop = loop_name()
    err.print(f"produce/consume bench ({'quick' if args.quick else 'full'}), event loop: {loop}")
    prof = Profiler(Path(args.profile) if args.profile else None)
    began = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="tidemq-pc-bench-", dir=args.dir))
    try:
        res = run(run_all(tmp, sizes, prof, not args.no_peers, args.otel, args.gc_freeze))
        res["gc_freeze"] = args.gc_freeze
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    total_s = time.perf_counter() - began
    rows = build_rows(res)
    print_table(f"tidemq produce/consume bench ({'quick' if args.quick else 'full'})", rows,
                caption=caption(res, sizes, loop, total_s))
    if args.otel:
        otel = res.get("tidemq", {}).get("otel", {})
        print_table("tidemq with OpenTelemetry tracing off / on (same run)", _otel.rows(otel),
                    caption=_otel.caption(otel))
    prof.summary()

    if args.json:
        tp = fig(res, "tidemq", "produce", "msgs_per_s")
        tpa = fig(res, "tidemq", "produce_await", "msgs_per_s")
        tc = fig(res, "tidemq", "consume", "msgs_per_s")
        traw = fig(res, "tidemq", "raw_pull", "msgs_per_s")
        peers = {}
        for key in ("redis", "nats"):
            for phase in ("produce", "produce_await", "consume"):
                peers[f"{key}_{phase}_msgs_per_s"] = fig(res, key, phase, "msgs_per_s")
            for phase in ("produce", "consume"):
                peers[f"{key}_client_us_per_msg_{phase}"] = fig(res, key, phase,
                                                                "client_us_per_msg")
                peers[f"{key}_server_us_per_msg_{phase}"] = fig(res, key, phase,
                                                                "server_us_per_msg")
            peers[f"{key}_p50_ms_at_1k"] = fig(res, key, "latency", "p50_ms")
            peers[f"{key}_p99_ms_at_1k"] = fig(res, key, "latency", "p99_ms")
            peers[f"{key}_p99_ms_at_10k"] = fig(res, key, "latency_10k", "p99_ms")
        rp, rc = peers["redis_produce_msgs_per_s"], peers["redis_consume_msgs_per_s"]
        rpa, npa = peers["redis_produce_await_msgs_per_s"], peers["nats_produce_await_msgs_per_s"]
        np_, nc = peers["nats_produce_msgs_per_s"], peers["nats_consume_msgs_per_s"]
        print_json({
            "bench": "produce_consume", "quick": args.quick, "event_loop": loop,
            "messages": sizes.messages, "body_bytes": BODY_BYTES, "senders": SENDERS,
            "produce_msgs_per_s": tp, "consume_msgs_per_s": tc,
            "consume_raw_pull_msgs_per_s": traw,
            "produce_in_flight_per_sender": WINDOW,
            "produce_await_msgs_per_s": tpa,
            "produce_await_ratio_vs_redis": ratio(tpa, rpa),
            "produce_await_ratio_vs_nats": ratio(tpa, npa),
            "p50_ms_at_1k": fig(res, "tidemq", "latency", "p50_ms"),
            "p99_ms_at_1k": fig(res, "tidemq", "latency", "p99_ms"),
            "p50_ms_at_10k": fig(res, "tidemq", "latency_10k", "p50_ms"),
            "p99_ms_at_10k": fig(res, "tidemq", "latency_10k", "p99_ms"),
            "client_us_per_msg_produce": fig(res, "tidemq", "produce", "client_us_per_msg"),
            "client_gc_us_per_msg_produce": fig(res, "tidemq", "produce",
                                                "client_gc_us_per_msg"),
            "gc_freeze": args.gc_freeze,
            "broker_us_per_msg_produce": fig(res, "tidemq", "produce", "server_us_per_msg"),
            "client_us_per_msg_consume": fig(res, "tidemq", "consume", "client_us_per_msg"),
            "broker_us_per_msg_consume": fig(res, "tidemq", "consume", "server_us_per_msg"),
            "latency_breakdown_ms_at_1k": res.get("tidemq", {}).get("latency_breakdown"),
            "produce_ratio_vs_redis": ratio(tp, rp), "consume_ratio_vs_redis": ratio(tc, rc),
            "consume_raw_ratio_vs_redis": ratio(traw, rc),
            "produce_ratio_vs_nats": ratio(tp, np_), "consume_ratio_vs_nats": ratio(tc, nc),
            **peers,
            "skipped": res["skipped"],
            "loadavg": res["loadavg"],
            "detail": {k: v for k, v in res.items()
                       if k not in ("skipped", "loadavg", "gc_freeze")},
            "targets_met": {r.figure: r.met for r in rows if r.met is not None},
            "total_s": total_s,
            **({"otel": _otel.summary(res.get("tidemq", {}).get("otel", {}))}
               if args.otel else {}),
        })
    failed = {k: v for k, v in res["skipped"].items() if v != "--no-peers"}
    return 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
