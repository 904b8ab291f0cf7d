"""Helpers of ``bench.produce_consume``: child servers on free ports, the shared workload
shapes (64 senders, read everything back, a paced latency run), and the two peers —
Redis Streams (redis-py asyncio) and NATS JetStream (nats-py) — written against the same shapes.

Nothing here imports pytest or the test tree. The peers' own parts (hiredis, nats-py,
nats-server) are installed by ``bench/install-peers.sh``, which ``ensure_peers`` runs when one
is missing: a peer that still cannot run is an error of the bench, not a skipped row.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from bench._common import progress

REPO = Path(__file__).resolve().parents[1]
BODY_BYTES = 1024
STAMP = 8  # latency bodies start with perf_counter_ns() as 8 big-endian bytes


# --- processes -------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 15.0, proc: subprocess.Popen[bytes] | None = None,
              log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"process exited with {proc.returncode} before listening on "
                               f"{port}:\n{tail}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


class Child:
    """A child server process; its output goes to ``<workdir>/<name>.log``."""

    def __init__(self, name: str, argv: Sequence[str], port: int, workdir: Path,
                 env: dict[str, str] | None = None, health: str | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.port = port
        self.workdir = workdir
        self.env = env
        self.health = health  # an HTTP path answered 200 once ready (else: port open)
        self.log = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self, timeout: float = 20.0) -> Child:
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **(self.env or {}), "PYTHONUNBUFFERED": "1"}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.argv, cwd=REPO, env=env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_port(self.port, timeout, self.proc, self.log)
            if self.health:
                self._wait_healthy(timeout)
        except BaseException:
            self.stop(signal.SIGKILL)
            raise
        return self

    def _wait_healthy(self, timeout: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}{self.health}",
                             timeout=0.5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"{self.name} not healthy after {timeout}s")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def python_service(name: str, port: int, workdir: Path, env: dict[str, str]) -> Child:
    return Child(name, [sys.executable, "-m", f"tidemq_server.{name}"], port, workdir, env,
                 health="/healthz")


def redis_server(workdir: Path, *, appendonly: bool) -> Child:
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server is not installed (scripts/install-system-deps.sh)")
    port = free_port()
    argv = [exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
            "--save", "", "--protected-mode", "no"]
    if appendonly:
        argv += ["--appendonly", "yes", "--appendfsync", "everysec"]
    return Child(f"redis-{port}", argv, port, workdir)


# --- workload shapes -------------------------------------------------------------------------
def make_bodies(seed: int, count: int = 256) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(BODY_BYTES) for _ in range(count)]


def stamped(pad: bytes) -> bytes:
    """A latency body: the send time (perf_counter_ns) and then padding up to 1 KiB."""
    return time.perf_counter_ns().to_bytes(STAMP, "big") + pad


def stamp_of(body: bytes) -> int:
    return int.from_bytes(body[:STAMP], "big")


def process_cpu_s(pids: Sequence[int | None]) -> float:
    """User + system CPU seconds the processes ``pids`` have used so far (gone ones: 0)."""
    import psutil

    total = 0.0
    for pid in pids:
        if pid is None:
            continue
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


@dataclass(slots=True)
class Throughput:
    msgs: int
    seconds: float
    cpu_s: float  # this (client) process's CPU over the phase
    extra: dict[str, Any] = field(default_factory=dict)
    server_cpu_s: float | None = None  # the server processes' CPU over the phase (None: unknown)

    @property
    def msgs_per_s(self) -> float:
        return self.msgs / self.seconds if self.seconds else 0.0

    def as_dict(self) -> dict[str, Any]:
        n, s = max(1, self.msgs), self.seconds
        out = {"msgs": self.msgs, "seconds": s, "msgs_per_s": self.msgs_per_s,
               "client_cpu_util": self.cpu_s / s if s else 0.0,
               "client_us_per_msg": self.cpu_s / n * 1e6, **self.extra}
        if self.server_cpu_s is not None:
            out["server_cpu_util"] = self.server_cpu_s / s if s else 0.0
            out["server_us_per_msg"] = self.server_cpu_s / n * 1e6
        return out


async def with_server_cpu(pids: Sequence[int | None], phase: Awaitable[Throughput]
                          ) -> Throughput:
    """Run ``phase`` and note the CPU the server processes ``pids`` spent meanwhile."""
    before = process_cpu_s(pids)
    res = await phase
    res.server_cpu_s = process_cpu_s(pids) - before
    return res


@dataclass(slots=True)
class Latency:
    samples_ms: list[float]
    sent: int
    received: int
    seconds: float  # the measured (post warm-up) sending span
    warmup_dropped: int

    def pct(self, p: float) -> float | None:
        s = self.samples_ms
        if not s:
            return None
        k = min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))
        return s[k]

    def as_dict(self) -> dict[str, Any]:
        s = self.samples_ms
        return {"p50_ms": self.pct(50), "p90_ms": self.pct(90), "p99_ms": self.pct(99),
                "p999_ms": self.pct(99.9), "max_ms": s[-1] if s else None,
                "mean_ms": statistics.fmean(s) if s else None, "samples": len(s),
                "sent": self.sent, "received": self.received,
                "achieved_rate": len(s) / self.seconds if self.seconds else 0.0,
                "warmup_dropped": self.warmup_dropped}


class Counter:
    """Counts received messages; ``done`` is set when ``target`` have arrived."""

    def __init__(self, target: int) -> None:
        self.n = 0
        self.target = target
        self.done = asyncio.Event()

    def add(self, k: int = 1) -> None:
        self.n += k
        if self.n >= self.target:
            self.done.set()


async def _monitor(prog: Any, task: Any, done: Callable[[], int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        prog.update(task, completed=done())
        try:
            await asyncio.wait_for(stop.wait(), 0.25)
        except TimeoutError:
            pass
    prog.update(task, completed=done())


async def timed(label: str, total: int, done: Callable[[], int],
                work: Awaitable[Any]) -> tuple[float, float]:
    """Run ``work`` under a progress bar: (wall seconds, client CPU seconds)."""
    with progress() as prog:
        task = prog.add_task(label, total=total)
        stop = asyncio.Event()
        mon = asyncio.create_task(_monitor(prog, task, done, stop))
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            await work
        finally:
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
            stop.set()
            await mon
    return elapsed, cpu


async def run_senders(n: int, senders: int, window: int, bodies: list[bytes],
                      send_window: Callable[[list[bytes]], Awaitable[None]],
                      label: str) -> Throughput:
    """``senders`` coroutines share ``n`` messages; each sends ``window`` at a time and waits
    for their acknowledgements before the next ones."""
    sent = 0
    shares = [n // senders + (1 if w < n % senders else 0) for w in range(senders)]

    async def sender(w: int, share: int) -> None:
        nonlocal sent
        nb = len(bodies)
        i = 0
        while i < share:
            k = min(window, share - i)
            await send_window([bodies[(w * 31 + i + j) % nb] for j in range(k)])
            i += k
            sent += k

    async def all_senders() -> None:
        await asyncio.gather(*(sender(w, s) for w, s in enumerate(shares)))

    elapsed, cpu = await timed(label, n, lambda: sent, all_senders())
    return Throughput(sent, elapsed, cpu)


async def paced_latency(rate: float, duration_s: float, warmup_s: float,
                        fire: Callable[[bytes], None], received: list[tuple[int, int]],
                        label: str, pad: bytes, drain_s: float = 5.0) -> Latency:
    """Call ``fire(body)`` ``rate`` times a second for ``warmup_s + duration_s``; each body
    carries its send time. The consumer appends ``(sent_ns, received_ns)`` to ``received``.
    Samples of messages sent during the warm-up are dropped."""
    total = int(rate * (warmup_s + duration_s))
    period = 1.0 / rate
    warm_n = int(rate * warmup_s)
    warm_until_ns = 0
    sent = 0

    async def pace() -> None:
        nonlocal sent, warm_until_ns
        t0 = time.perf_counter()
        i = 0
        while i < total:
            now = time.perf_counter()
            target = t0 + i * period
            if target > now:
                await asyncio.sleep(target - now)
                now = time.perf_counter()
            while i < total and t0 + i * period <= now:
                if i == warm_n:
                    warm_until_ns = time.perf_counter_ns()
                fire(stamped(pad))
                i += 1
                sent = i
        deadline = time.monotonic() + drain_s
        while len(received) < total and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)

    t_start = time.perf_counter()
    await timed(label, total, lambda: len(received), pace())
    spent = time.perf_counter() - t_start
    kept = sorted((r - s) / 1e6 for s, r in received if s >= warm_until_ns)
    return Latency(kept, sent, len(received), max(1e-9, min(duration_s, spent)),
                   len(received) - len(kept))


# --- Redis Streams ---------------------------------------------------------------------------
class RedisStreamsPeer:
    """XADD pipelines by 64 senders; XREADGROUP + XACK readers; a separate redis-server with
    ``appendonly yes`` and ``appendfsync everysec``."""

    name = "Redis Streams"
    STREAM = "bench:tp"
    LAT_STREAM = "bench:lat"
    GROUP = "bench"

    def __init__(self, workdir: Path, readers: int = 2, read_count: int = 500) -> None:
        self.server = redis_server(workdir, appendonly=True)
        self.readers = readers
        self.read_count = read_count
        self.client: Any = None

    @staticmethod
    def available() -> str | None:
        """None when the peer can run, else why not (nothing imported: see ensure_peers)."""
        if shutil.which("redis-server") is None:
            return "redis-server not installed"
        if importlib.util.find_spec("redis") is None:
            return "redis-py not installed"
        if importlib.util.find_spec("hiredis") is None:  # what a Redis user installs
            return "hiredis not installed (bench/install-peers.sh installs it)"
        return None

    @property
    def pids(self) -> list[int | None]:
        return [self.server.pid]

    def describe(self) -> str:
        import hiredis
        import redis

        parser = f"hiredis {getattr(hiredis, '__version__', '?')} parser"
        version = subprocess.run([self.server.argv[0], "--version"], capture_output=True,
                                 text=True).stdout.split()
        server = next((v.split("=")[1] for v in version if v.startswith("v=")), "?")
        return f"redis-server {server}, redis-py {redis.__version__} ({parser})"

    async def start(self, senders: int) -> None:
        import redis.asyncio as aioredis
        from redis.utils import HIREDIS_AVAILABLE

        if not HIREDIS_AVAILABLE:
            raise RuntimeError("redis-py does not use hiredis (installed after redis was "
                               "imported?): the peer would not be the fair one")

        await asyncio.to_thread(self.server.start)
        # more commands in flight than connections (the 10,000 msg/s latency phase) wait for
        # one, as with tidemq's coalescer queue, instead of failing
        pool = aioredis.BlockingConnectionPool(host="127.0.0.1", port=self.server.port,
                                               max_connections=senders + self.readers + 16,
                                               timeout=None)
        self.client = aioredis.Redis(connection_pool=pool)
        await self.client.ping()

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()
        await asyncio.to_thread(self.server.stop)

    async def produce(self, n: int, senders: int, window: int,
                      bodies: list[bytes]) -> Throughput:
        """Into ``bench:tp`` (read back by ``consume``) when ``window > 1``, else ``bench:tp1``
        with one XADD awaited at a time."""
        client = self.client
        stream = self.STREAM if window > 1 else self.STREAM + "1"

        async def send_window(batch: list[bytes]) -> None:
            if len(batch) == 1:
                await client.xadd(stream, {b"d": batch[0]})
                return
            pipe = client.pipeline(transaction=False)
            for body in batch:
                pipe.xadd(stream, {b"d": body})
            await pipe.execute()

        label = (f"redis: {senders} senders x XADD" if window == 1 else
                 f"redis: {senders} senders x {window}-XADD pipelines")
        res = await run_senders(n, senders, window, bodies, send_window, label)
        length = await client.xlen(stream)
        if length != n:
            raise RuntimeError(f"redis: stream holds {length} entries, expected {n}")
        return res

    async def consume(self, n: int, handle: Callable[[bytes], None]) -> Throughput:
        client, stream, group = self.client, self.STREAM, self.GROUP
        await client.xgroup_create(stream, group, id="0")
        counter = Counter(n)

        async def reader(k: int) -> None:
            name = f"c{k}"
            while not counter.done.is_set():
                resp = await client.xreadgroup(group, name, {stream: ">"},
                                               count=self.read_count, block=200)
                if not resp:
                    continue
                entries = resp[0][1]
                for _, fields in entries:
                    handle(fields[b"d"])
                await client.xack(stream, group, *(eid for eid, _ in entries))
                counter.add(len(entries))

        async def work() -> None:
            tasks = [asyncio.create_task(reader(k)) for k in range(self.readers)]
            try:
                await counter.done.wait()
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

        elapsed, cpu = await timed(f"redis: XREADGROUP x{self.read_count} + XACK, "
                                   f"{self.readers} readers", n, lambda: counter.n, work())
        return Throughput(counter.n, elapsed, cpu)

    async def latency(self, rate: float, duration_s: float, warmup_s: float,
                      pad: bytes) -> Latency:
        client, stream, group = self.client, f"{self.LAT_STREAM}:{rate:.0f}", self.GROUP
        await client.xgroup_create(stream, group, id="$", mkstream=True)
        received: list[tuple[int, int]] = []
        stop = asyncio.Event()
        pending: set[asyncio.Task[Any]] = set()

        async def reader() -> None:
            while not stop.is_set():
                resp = await client.xreadgroup(group, "lat", {stream: ">"}, count=100,
                                               block=100)
                if not resp:
                    continue
                now = time.perf_counter_ns()
                entries = resp[0][1]
                for _, fields in entries:
                    received.append((stamp_of(fields[b"d"]), now))
                await client.xack(stream, group, *(eid for eid, _ in entries))

        def fire(body: bytes) -> None:
            task = asyncio.create_task(client.xadd(stream, {b"d": body}))
            pending.add(task)
            task.add_done_callback(pending.discard)

        rd = asyncio.create_task(reader())
        try:
            return await paced_latency(rate, duration_s, warmup_s, fire, received,
                                       f"redis: latency at {rate:,.0f} msg/s", pad)
        finally:
            stop.set()
            await asyncio.gather(rd, *pending, return_exceptions=True)


# --- NATS JetStream --------------------------------------------------------------------------
class NatsPeer:
    """publish_async windows by 64 senders; pull-subscription fetch + ack; ``nats-server -js``
    with file storage in a temp dir."""

    name = "NATS JetStream"
    STREAM = "BENCH"
    SUBJECT = "bench.tp"
    LAT_STREAM = "BENCHLAT"
    LAT_SUBJECT = "bench.lat"  # the latency phase at R msg/s publishes to bench.lat.R

    def __init__(self, workdir: Path, fetch_batch: int = 256) -> None:
        exe = shutil.which("nats-server") or "nats-server"
        port = free_port()
        self.server = Child(f"nats-{port}", [exe, "-js", "-sd", str(workdir / "jetstream"),
                                             "-a", "127.0.0.1", "-p", str(port)], port, workdir)
        self.fetch_batch = fetch_batch
        self.nc: Any = None
        self.js: Any = None

    @staticmethod
    def available() -> str | None:
        if shutil.which("nats-server") is None:
            return "nats-server not installed (bench/install-peers.sh installs it)"
        if importlib.util.find_spec("nats") is None:
            return "nats-py not installed (bench/install-peers.sh installs it)"
        return None

    def describe(self) -> str:
        import nats

        version = subprocess.run([self.server.argv[0], "--version"], capture_output=True,
                                 text=True).stdout.strip()
        try:
            client = metadata.version("nats-py")
        except metadata.PackageNotFoundError:
            client = getattr(nats, "__version__", "?")
        return f"{version or 'nats-server ?'}, nats-py {client}"

    @property
    def pids(self) -> list[int | None]:
        return [self.server.pid]

    async def start(self, senders: int) -> None:
        import nats
        from nats.js.api import StorageType

        await asyncio.to_thread(self.server.start)
        self.nc = await nats.connect(f"nats://127.0.0.1:{self.server.port}",
                                     max_reconnect_attempts=0)
        self.js = js = self.nc.jetstream(publish_async_max_pending=65536)
        for name, subject in ((self.STREAM, self.SUBJECT), (self.STREAM + "1", self.SUBJECT + "1"),
                              (self.LAT_STREAM, self.LAT_SUBJECT + ".>")):
            await js.add_stream(name=name, subjects=[subject], storage=StorageType.FILE)

    async def close(self) -> None:
        if self.nc is not None:
            try:
                await self.nc.close()
            except Exception:  # a closing client must not fail the bench
                pass
        await asyncio.to_thread(self.server.stop)

    async def produce(self, n: int, senders: int, window: int,
                      bodies: list[bytes]) -> Throughput:
        """Into ``BENCH`` (read back by ``consume``) when ``window > 1``, else ``BENCH1``."""
        js = self.js
        suffix = "" if window > 1 else "1"
        subject = self.SUBJECT + suffix

        async def send_window(batch: list[bytes]) -> None:
            futures = [await js.publish_async(subject, body) for body in batch]
            await asyncio.gather(*futures)

        label = (f"nats: {senders} senders x await publish_async" if window == 1 else
                 f"nats: {senders} senders x {window} publish_async in flight")
        res = await run_senders(n, senders, window, bodies, send_window, label)
        info = await js.stream_info(self.STREAM + suffix)
        if info.state.messages != n:
            raise RuntimeError(f"nats: stream holds {info.state.messages}, expected {n}")
        return res

    async def consume(self, n: int, handle: Callable[[bytes], None]) -> Throughput:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        sub = await self.js.pull_subscribe(
            self.SUBJECT, durable="bench", stream=self.STREAM,
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT,
                                  deliver_policy=DeliverPolicy.ALL, max_ack_pending=-1))
        counter = Counter(n)

        async def reader() -> None:
            while not counter.done.is_set():
                try:
                    msgs = await sub.fetch(self.fetch_batch, timeout=1.0)
                except TimeoutError:
                    continue
                for m in msgs:
                    handle(m.data)
                    await m.ack()
                counter.add(len(msgs))

        async def work() -> None:  # one reader: concurrent fetches on one subscription stall
            task = asyncio.create_task(reader())
            try:
                await counter.done.wait()
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

        elapsed, cpu = await timed(f"nats: fetch x{self.fetch_batch} + ack", n,
                                   lambda: counter.n, work())
        await sub.unsubscribe()
        return Throughput(counter.n, elapsed, cpu)

    async def latency(self, rate: float, duration_s: float, warmup_s: float,
                      pad: bytes) -> Latency:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        js = self.js
        subject = f"{self.LAT_SUBJECT}.{rate:.0f}"
        sub = await js.pull_subscribe(
            subject, durable=f"lat{rate:.0f}", stream=self.LAT_STREAM,
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT,
                                  deliver_policy=DeliverPolicy.NEW))
        received: list[tuple[int, int]] = []
        stop = asyncio.Event()
        pending: set[asyncio.Task[Any]] = set()

        async def reader() -> None:
            while not stop.is_set():
                try:  # up to 100 at once, as the Redis reader's XREADGROUP count
                    msgs = await sub.fetch(100, timeout=0.5)
                except TimeoutError:
                    continue
                now = time.perf_counter_ns()
                for m in msgs:
                    received.append((stamp_of(m.data), now))
                    await m.ack()

        async def publish(body: bytes) -> None:
            await (await js.publish_async(subject, body))

        def fire(body: bytes) -> None:
            task = asyncio.create_task(publish(body))
            pending.add(task)
            task.add_done_callback(pending.discard)

        rd = asyncio.create_task(reader())
        try:
            return await paced_latency(rate, duration_s, warmup_s, fire, received,
                                       f"nats: latency at {rate:,.0f} msg/s", pad)
        finally:
            stop.set()
            await asyncio.gather(rd, *pending, return_exceptions=True)


# --- peers' parts ------------------------------------------------------------------------------
def ensure_peers(peers: Sequence[Any]) -> dict[str, str]:
    """Install what a peer misses (``bench/install-peers.sh``, once) and say which still cannot
    run and why: ``{peer name: reason}``, empty when every peer can run."""
    missing = {p.name: why for p in peers if (why := p.available()) is not None}
    if missing:
        script = REPO / "bench" / "install-peers.sh"
        subprocess.run(["bash", str(script), sys.prefix], check=False)  # the running venv
        importlib.invalidate_caches()
        missing = {p.name: why for p in peers if (why := p.available()) is not None}
    return missing
