"""Transactions benchmark: transactional sends beside plain sends, and a check-back sweep.

Run ``python -m bench.transactions [--quick] [--json]``.

The bench starts its own redis-server, broker (``flush=async``) and, for the sweep, a checker,
on free ports with data in a temp dir, and stops them at the end. Bodies are 512 bytes.

1. plain      ``Producer.send`` from 256 concurrent senders (the SDK coalesces concurrent
              sends into batch requests): N messages (quick 10k, full 50k), msgs/s.
2. txn        ``TransactionProducer.send`` from 256 concurrent senders, N messages: each is a
              half message, a local transaction that answers COMMIT at once, and an end (halves
              and ends are coalesced into ``POST /v1/transactions`` / ``.../end`` batches);
              msgs/s counted once every message is committed and consumable. Target: >= 0.6x
              plain. Extra row: the same with ``wait_for_end=False`` (RocketMQ's oneway end:
              the ends ride along with the next half messages).
3. sweep      P half messages nobody ended (quick 10k, full 100k), stored through the batch
              endpoint, all older than the checker's immunity; a producer of their group is
              alive and answers every check with COMMIT. The checker starts (quick: 1 s check
              interval, 0.5 s immunity; full: the defaults, 30 s and 6 s): the time from its
              start until all P are delivered, and its peak resident memory. Target: within
              one default check interval (30 s).
4. orphans    (run before the sweep) O half messages nobody ends (quick 20, full 100), stored
              one at a time with a 1 s check_immunity_s while a checker with the default
              interval (30 s) runs, once its first scan has caught up with the rounds before:
              p50/p99 of the time from each one's immunity expiry to its check reaching the
              polling producer. Target: p99 <= 1 s (see bench/_orphans.py).

Plain and the two txn modes alternate three times (the box is shared and noisy); the best of each
is used. CPU per message on each side: this process (the client, ``time.process_time``) and the
broker process (psutil), over each round divided by its messages; the least of the rounds. The
JSON line has at least ``txn_vs_plain_ratio``, ``check_sweep_s``, ``check_sweep_pending``,
``orphan_check_p99_s_over_immunity`` and ``{client,broker}_us_per_msg_{plain,txn,oneway}``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgpack
from tidemq.protocol.records._compiled import COMPILED

from bench._common import Row, err, loop_name, print_json, print_table, progress, run
from bench._orphans import IMMUNITY_S, TARGET_LATE_S, OrphanResult, orphan_checks
from bench._peers import process_cpu_s
from tidemq_server.common.constants import TOKEN_HEADER, TRANSACTION_CHECK_INTERVAL_MS

REPO = Path(__file__).resolve().parents[1]
BODY = b"t" * 512
SENDERS = 256
QUEUES = 8
TOKEN = "bench-token"
HALF_BATCH = 1024
TARGET_RATIO = 0.6  # issue 13: transactional send >= 0.6x plain
TARGET_SWEEP_S = 30.0  # one default check interval


@dataclass(frozen=True, slots=True)
class Sizes:
    sends: int
    pending: int
    interval_ms: int
    immunity_ms: int
    rounds: int
    orphans: int


QUICK = Sizes(sends=10_000, pending=10_000, interval_ms=1_000, immunity_ms=500, rounds=3,
              orphans=20)
FULL = Sizes(sends=50_000, pending=100_000, interval_ms=30_000, immunity_ms=6_000, rounds=3,
             orphans=100)


# --- processes ---------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Child:
    """A server process on a free port; output to ``<workdir>/<name>.log``."""

    def __init__(self, name: str, argv: list[str], port: int, workdir: Path,
                 env: dict[str, str] | None = None, health: bool = True) -> None:
        self.name, self.argv, self.port, self.workdir = name, argv, port, workdir
        self.env, self.health = env or {}, health
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> Child:
        log = open(self.workdir / f"{self.name}.log", "ab")
        self.proc = subprocess.Popen(self.argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **self.env, "PYTHONUNBUFFERED": "1"})
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = (self.workdir / f"{self.name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{tail}")
            try:
                if self.health:
                    if httpx.get(f"http://127.0.0.1:{self.port}/healthz",
                                 timeout=0.5).status_code == 200:
                        return self
                else:
                    socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                    return self
            except (httpx.HTTPError, OSError):
                pass
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"{self.name} did not start within {timeout}s")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def service(name: str, workdir: Path, prefix: str, env: dict[str, str]) -> Child:
    port = free_port()
    env = {f"{prefix}PORT": str(port), f"{prefix}LOG_LEVEL": "warning", **env}
    return Child(name, [sys.executable, "-m", f"tidemq_server.{name}"], port, workdir, env)


# --- the workloads -----------------------------------------------------------------------------
class CommitAll:
    """A listener whose local transaction always commits, and whose checks answer commit."""

    async def execute_local_transaction(self, message: Any, arg: Any) -> Any:
        from tidemq import TransactionState
        return TransactionState.COMMIT

    async def check_local_transaction(self, message: Any) -> Any:
        from tidemq import TransactionState
        return TransactionState.COMMIT


async def stored(http: httpx.AsyncClient, broker: str, topic: str) -> int:
    r = await http.get(f"{broker}/v1/topics/{topic}")
    r.raise_for_status()
    return sum(int(o["max"]) - int(o["min"]) for o in r.json()["offsets"])


async def create_topic(http: httpx.AsyncClient, broker: str, topic: str) -> None:
    r = await http.put(f"{broker}/v1/topics/{topic}", json={"queues": QUEUES})
    r.raise_for_status()


async def drive(label: str, n: int, send: Any) -> float:
    """``send(i)`` for i < n from SENDERS workers; the elapsed seconds."""
    counter = iter(range(n))
    with progress() as bar:
        task = bar.add_task(label, total=n)

        async def worker() -> None:
            for i in counter:
                await send(i)
                bar.advance(task)

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(SENDERS)))
        return time.perf_counter() - began


async def plain_round(broker: str, http: httpx.AsyncClient, n: int) -> float:
    from tidemq import Producer

    topic = f"plain-{uuid.uuid4().hex[:8]}"
    await create_topic(http, broker, topic)
    async with Producer(broker_url=broker) as producer:
        seconds = await drive("plain sends", n, lambda i: producer.send(BODY, topic=topic))
    if await stored(http, broker, topic) != n:
        raise RuntimeError(f"plain: {topic} does not hold {n} messages")
    return n / seconds


async def txn_round(broker: str, http: httpx.AsyncClient, n: int, oneway: bool) -> float:
    """Transactions per second, counted until all ``n`` are committed and consumable."""
    from tidemq import TransactionProducer, TransactionState

    topic = f"txn-{uuid.uuid4().hex[:8]}"
    await create_topic(http, broker, topic)
    async with TransactionProducer(f"bench-{topic}", CommitAll(), broker_url=broker,
                                   wait_for_end=not oneway) as producer:
        began = time.perf_counter()
        async def send(i: int) -> None:
            result = await producer.send(BODY, topic=topic)
            if result.local_state is not TransactionState.COMMIT or result.end_error:
                raise RuntimeError(f"transaction {result.transaction_id} did not commit")

        label = "transactional sends, oneway end" if oneway else "transactional sends"
        await drive(label, n, send)
        while await stored(http, broker, topic) < n:  # the last ends (oneway) are in flight
            await asyncio.sleep(0.002)
            if time.perf_counter() - began > 120:
                raise RuntimeError(f"txn: {topic} does not hold {n} committed messages")
        return n / (time.perf_counter() - began)


async def with_cpu(pid: int | None, n: int, rate: Any) -> tuple[float, float, float]:
    """``(msgs/s, client µs per message, broker µs per message)`` of one round ``rate``."""
    client0, broker0 = time.process_time(), process_cpu_s([pid])
    got = await rate
    return (got, (time.process_time() - client0) / n * 1e6,
            (process_cpu_s([pid]) - broker0) / n * 1e6)


async def store_halves(http: httpx.AsyncClient, broker: str, group: str, topic: str,
                       n: int) -> None:
    with progress() as bar:
        task = bar.add_task(f"storing {n:,} pending half messages", total=n)
        sem = asyncio.Semaphore(4)

        async def one(count: int) -> None:
            body = msgpack.packb({"producer_group": group, "topic": topic,
                                  "messages": [{"body": BODY} for _ in range(count)]},
                                 use_bin_type=True)
            async with sem:
                r = await http.post(f"{broker}/v1/transactions", content=body,
                                    headers={"content-type": "application/msgpack"})
            r.raise_for_status()
            bar.advance(task, count)

        await asyncio.gather(*(one(min(HALF_BATCH, n - i)) for i in range(0, n, HALF_BATCH)))


async def checker_peak_rss(url: str) -> float | None:
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(f"{url}/metrics")).text
    for line in text.splitlines():
        if line.startswith("tidemq_checker_peak_rss_bytes "):
            return float(line.split()[1])
    return None


async def sweep(tmp: Path, broker: str, redis_url: str, cluster: str, sizes: Sizes,
                http: httpx.AsyncClient) -> dict[str, Any]:
    from tidemq import TransactionProducer

    topic, group = f"sweep-{uuid.uuid4().hex[:8]}", f"bench-sweep-{uuid.uuid4().hex[:6]}"
    n = sizes.pending
    await create_topic(http, broker, topic)
    began = time.perf_counter()
    await store_halves(http, broker, group, topic, n)
    stored_s = time.perf_counter() - began
    await asyncio.sleep(sizes.immunity_ms / 1000 + 0.2)  # every half is due at the first scan
    answering = TransactionProducer(group, CommitAll(), broker_url=broker, check_max=1024,
                                    check_concurrency=256)
    await answering.start()
    await asyncio.sleep(0.5)  # its heartbeat is in: checks have a live producer
    checker = service("checker", tmp, "TIDEMQ_CHECKER_", {
        "TIDEMQ_CHECKER_BROKER_URL": broker, "TIDEMQ_CHECKER_REDIS_URL": redis_url,
        "TIDEMQ_CHECKER_TOKEN": TOKEN, "TIDEMQ_CHECKER_CLUSTER": cluster,
        "TIDEMQ_CHECKER_CHECK_INTERVAL_MS": str(sizes.interval_ms),
        "TIDEMQ_CHECKER_TRANSACTION_TIMEOUT_MS": str(sizes.immunity_ms),
        "TIDEMQ_CHECKER_BATCH_SIZE": "1024"})
    try:
        started = time.perf_counter()
        await asyncio.to_thread(checker.start)
        with progress() as bar:
            task = bar.add_task("check sweep: delivered after a check", total=n)
            done = 0
            while done < n:
                await asyncio.sleep(0.2)
                done = await stored(http, broker, topic)
                bar.update(task, completed=done)
                if time.perf_counter() - started > 10 * TARGET_SWEEP_S:
                    raise RuntimeError(f"sweep: only {done} of {n} delivered")
        sweep_s = time.perf_counter() - started
        peak = await checker_peak_rss(f"http://127.0.0.1:{checker.port}")
    finally:
        await answering.close()
        await asyncio.to_thread(checker.stop)
    return {"sweep_s": sweep_s, "pending": n, "checker_peak_rss": peak,
            "checks_per_s": n / sweep_s, "store_halves_s": stored_s,
            "answered": answering.checks_answered}


async def orphans(tmp: Path, broker: str, redis_url: str, cluster: str, sizes: Sizes,
                  http: httpx.AsyncClient) -> OrphanResult:
    """Orphaned halves under a checker with the default interval and timeout."""
    topic = f"orphans-{uuid.uuid4().hex[:8]}"
    await create_topic(http, broker, topic)

    async def start_checker() -> Any:
        checker = service("checker", tmp, "TIDEMQ_CHECKER_", {
            "TIDEMQ_CHECKER_BROKER_URL": broker, "TIDEMQ_CHECKER_REDIS_URL": redis_url,
            "TIDEMQ_CHECKER_TOKEN": TOKEN, "TIDEMQ_CHECKER_CLUSTER": cluster})
        await asyncio.to_thread(checker.start)
        # A new checker first catches up with the halves and ends the send rounds left (tens of
        # thousands): one scan on request, answered once it is done. The figure is the steady
        # state after it, not that one-time catch-up.
        caught_up = time.perf_counter()
        r = await http.post(f"http://127.0.0.1:{checker.port}/internal/v1/scan",
                            headers={TOKEN_HEADER: TOKEN}, timeout=300)
        r.raise_for_status()
        err.print(f"orphans: the new checker caught up in {time.perf_counter() - caught_up:.1f} s"
                  f" ({r.json().get('examined', '?')} half copies examined)")

        async def stop() -> None:
            await asyncio.to_thread(checker.stop)
        return stop

    return await orphan_checks(http, broker, topic, sizes.orphans,
                               TRANSACTION_CHECK_INTERVAL_MS / 1000, start_checker)


async def run_bench(tmp: Path, sizes: Sizes) -> dict[str, Any]:
    redis_port = free_port()
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server is not installed: run scripts/install-system-deps.sh")
    (tmp / "redis").mkdir()
    redis = Child("redis", [exe, "--port", str(redis_port), "--bind", "127.0.0.1", "--dir",
                            str(tmp / "redis"), "--save", "", "--appendonly", "no"],
                  redis_port, tmp, health=False)
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    cluster = f"bench-{uuid.uuid4().hex[:8]}"
    broker = service("broker", tmp, "TIDEMQ_BROKER_", {
        "TIDEMQ_BROKER_DATA_DIR": str(tmp / "broker"), "TIDEMQ_BROKER_REDIS_URL": redis_url,
        "TIDEMQ_BROKER_CLUSTER": cluster, "TIDEMQ_BROKER_TOKEN": TOKEN,
        "TIDEMQ_BROKER_FLUSH": "async", "TIDEMQ_BROKER_GRPC_ENABLED": "false"})
    await asyncio.to_thread(redis.start)
    try:
        await asyncio.to_thread(broker.start)
        url = f"http://127.0.0.1:{broker.port}"
        async with httpx.AsyncClient(timeout=60) as http:
            plain: list[tuple[float, float, float]] = []  # (msgs/s, client µs, broker µs)
            txn: list[tuple[float, float, float]] = []
            oneway: list[tuple[float, float, float]] = []
            pid, n = broker.proc.pid if broker.proc else None, sizes.sends
            for _ in range(sizes.rounds):
                plain.append(await with_cpu(pid, n, plain_round(url, http, n)))
                txn.append(await with_cpu(pid, n, txn_round(url, http, n, oneway=False)))
                oneway.append(await with_cpu(pid, n, txn_round(url, http, n, oneway=True)))
            # orphans before the sweep: the sweep ends with thousands of re-put check copies
            # whose ends only its checker process read; a new checker waits one transaction
            # timeout (6 s) before passing them, which is a restart's cost, not this figure
            orphaned = await orphans(tmp, url, redis_url, cluster, sizes, http)
            swept = await sweep(tmp, url, redis_url, cluster, sizes, http)
    finally:
        await asyncio.to_thread(broker.stop)
        await asyncio.to_thread(redis.stop)
    return {"plain": [r[0] for r in plain], "txn": [r[0] for r in txn],
            "oneway": [r[0] for r in oneway], "sweep": swept, "orphans": orphaned,
            "cpu": {"plain": least_cpu(plain), "txn": least_cpu(txn),
                    "oneway": least_cpu(oneway)}}


def least_cpu(rounds: list[tuple[float, float, float]]) -> tuple[float, float]:
    """(client, broker) µs per message: each side's least over the rounds (the round least
    disturbed by the shared box)."""
    return min(r[1] for r in rounds), min(r[2] for r in rounds)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.transactions", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, short check interval")
    ap.add_argument("--json", action="store_true", help="one JSON object on the last line")
    ap.add_argument("--dir", default=None, help="scratch directory (default: system temp)")
    args = ap.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    loop = loop_name()
    err.print(f"transactions bench ({'quick' if args.quick else 'full'}), event loop: {loop}")
    began = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="tidemq-tx-bench-", dir=args.dir))
    try:
        res = run(run_bench(tmp, sizes))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    total_s = time.perf_counter() - began
    plain, txn, sw = max(res["plain"]), max(res["txn"]), res["sweep"]
    oneway = max(res["oneway"])
    orph: OrphanResult = res["orphans"]
    ratio = txn / plain if plain else 0.0
    oneway_ratio = oneway / plain if plain else 0.0
    peak = sw["checker_peak_rss"]
    cpu = res["cpu"]
    rows = [
        Row(f"plain sends, {SENDERS} senders (best of {sizes.rounds})", plain, "msgs/s", 1.0),
        Row(f"transactional sends (half + local commit + end), {SENDERS} senders", txn,
            "msgs/s", ratio, f">= {TARGET_RATIO}x plain", ratio >= TARGET_RATIO),
        Row("transactional sends, end not awaited (wait_for_end=False, extra)", oneway,
            "msgs/s", oneway_ratio),
        *[Row(f"  CPU per message, {what}: client / broker", cpu[key][0], "µs",
              target=f"broker {cpu[key][1]:.1f} µs")
          for key, what in (("plain", "plain"), ("txn", "transactional"),
                            ("oneway", "transactional, end not awaited"))],
        Row(f"check sweep: {sw['pending']:,} pending halves, checked and committed",
            sw["sweep_s"], "s", target=f"<= {TARGET_SWEEP_S:.0f} s (one check interval)",
            met=sw["sweep_s"] <= TARGET_SWEEP_S),
        Row("check sweep rate", sw["checks_per_s"], "checks/s"),
        Row("checker peak resident memory", None if peak is None else peak / 2**20, "MiB"),
        Row("storing the pending halves (batch endpoint)",
            sw["pending"] / sw["store_halves_s"], "msgs/s"),
        Row(f"orphaned half checked after its immunity, p50 ({orph.count} halves)", orph.p50,
            "s"),
        Row(f"orphaned half checked after its immunity, p99 ({orph.count} halves)", orph.p99,
            "s", target=f"<= {TARGET_LATE_S:.0f} s", met=orph.p99 <= TARGET_LATE_S),
    ]
    notes = [f"event loop: {loop}; {os.cpu_count()} CPUs; {len(BODY)} B bodies; broker "
             f"flush=async; total {total_s:.0f} s",
             "plain runs: " + ", ".join(f"{v:,.0f}" for v in res["plain"]) + "; txn runs: "
             + ", ".join(f"{v:,.0f}" for v in res["txn"]) + "; oneway-end runs: "
             + ", ".join(f"{v:,.0f}" for v in res["oneway"]) + " msgs/s (transactions "
             "counted until committed)",
             f"sweep: checker interval {sizes.interval_ms} ms, immunity {sizes.immunity_ms} ms; "
             f"time counted from the checker's start; {sw['answered']:,} checks answered",
             f"orphans: check_immunity_s {IMMUNITY_S:.0f} s, checker interval "
             f"{TRANSACTION_CHECK_INTERVAL_MS} ms (default); late by (s): "
             + ", ".join(f"{v:.2f}" for v in orph.late_s[:30])
             + (", ..." if orph.count > 30 else "")]
    print_table(f"tidemq transactions bench ({'quick' if args.quick else 'full'})", rows,
                caption="\n".join(notes))
    if args.json:
        print_json({
            "bench": "transactions", "quick": args.quick, "event_loop": loop,
            "plain_msgs_per_s": plain, "txn_msgs_per_s": txn, "txn_vs_plain_ratio": ratio,
            "plain_runs": res["plain"], "txn_runs": res["txn"],
            "txn_oneway_msgs_per_s": oneway, "txn_oneway_vs_plain_ratio": oneway_ratio,
            "txn_oneway_runs": res["oneway"],
            "txn_broker_us": cpu["txn"][1],  # broker CPU per transaction (issue 33's target key)
            "compiled": COMPILED,  # the compiled record core ran (else the pure-Python one)
            **{f"{side}_us_per_msg_{key}": cpu[key][i] for key in ("plain", "txn", "oneway")
               for i, side in enumerate(("client", "broker"))},
            "check_sweep_s": sw["sweep_s"], "check_sweep_pending": sw["pending"],
            "check_sweep_checks_per_s": sw["checks_per_s"],
            "checker_peak_rss_bytes": peak, "check_interval_ms": sizes.interval_ms,
            "orphan_check_p50_s_over_immunity": orph.p50,
            "orphan_check_p99_s_over_immunity": orph.p99, "orphan_count": orph.count,
            "targets_met": {r.figure: r.met for r in rows if r.met is not None},
            "total_s": total_s,
        })
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
