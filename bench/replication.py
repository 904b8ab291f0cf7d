"""Replication benchmark: produce throughput by copy count and mode, and failover time.

Run ``python -m bench.replication [--quick] [--json]``.

Real processes on free ports (data in a temp dir): one redis-server, one nameserver, one etcd
(Debian's ``etcd-server``) and the brokers of one group (``broker-a``). The client is this one
process (the SDK).

1. throughput   for each of R=1, R=2 sync, R=3 sync and R=3 async a fresh group is started;
                a topic with 8 queues; SENDERS coroutines x WINDOW sends in flight share N
                messages of 1 KiB (quick 16k, full 40k), each acknowledged as the mode says
                (sync: once ``min_insync`` = a majority of the copies hold it), THROUGHPUT_RUNS
                times on the same group: the best run is the figure (the box is shared and
                noisy; a quick run of 4k messages lasted 0.1 s, too short to be one). All copies
                share this machine's cores with the client, so the ratios show replication's
                cost *here*, not on separate hosts.
2. failover     on a R=3 sync group with the broker's default lease and election interval, a
                producer sends continuously (16 coroutines, each awaiting its send) while the
                primary is SIGKILLed, ROUNDS times (quick 3, full 10), then stopped with
                SIGTERM (a planned restart) as many times; the stopped member is started
                again and caught up before the next round. Failover seconds: how long the
                group could not acknowledge a send: the longest stretch without any
                acknowledgement from the signal until the first acknowledgement of a send
                started after the old primary was gone. Application errors are counted (with
                today's SDK retry policy a long failover may surface some). At the end every
                acknowledged id is looked up in the primary's queues: lost = acknowledged but
                not stored (must be 0).

CPU per message, each side, over all the runs of each throughput phase: this process (the
client, ``time.process_time``) and every broker of the group together (psutil; primary and
replicas).

Targets (this machine): R=3 sync >= 0.5x and R=3 async >= 0.8x of R=1; lost = 0; failover
(SIGKILL) <= 3 s and planned (SIGTERM) <= 0.5 s on a quiet machine (issue 32).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from tidemq import Producer

from bench._common import Row, err, loop_name, print_json, print_table, run
from bench._peers import BODY_BYTES, Child, free_port, make_bodies, process_cpu_s, redis_server

TOKEN = "bench-token"
QUEUES = 8
SENDERS = 32
WINDOW = 8
FAILOVER_SENDERS = 16
THROUGHPUT_RUNS = 3  # runs per configuration; the best is its figure
CONFIGS = (("R=1", 1, "sync"), ("R=2 sync", 2, "sync"), ("R=3 sync", 3, "sync"),
           ("R=3 async", 3, "async"))


class Group:
    """etcd + nameserver + ``copies`` brokers of broker-a."""

    def __init__(self, workdir: Path, redis_url: str, copies: int, replication: str) -> None:
        self.workdir = workdir
        self.copies = copies
        port, peer = free_port(), free_port()
        url, peer_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer}"
        self.etcd = Child("etcd", [shutil.which("etcd") or "/usr/bin/etcd", "--name", "b",
                                   "--data-dir", str(workdir / "etcd"),
                                   "--listen-client-urls", url, "--advertise-client-urls", url,
                                   "--listen-peer-urls", peer_url,
                                   "--initial-advertise-peer-urls", peer_url,
                                   "--initial-cluster", f"b={peer_url}", "--log-level", "warn"],
                          port, workdir, health="/health")
        ns = free_port()
        self.ns_url = f"http://127.0.0.1:{ns}"
        self.nameserver = Child("nameserver",
                                [sys.executable, "-m", "tidemq_server.nameserver"], ns, workdir,
                                {"TIDEMQ_NAMESRV_PORT": str(ns),
                                 "TIDEMQ_NAMESRV_TOKEN": TOKEN,
                                 "TIDEMQ_NAMESRV_WARMUP_S": "0",
                                 "TIDEMQ_NAMESRV_LOG_LEVEL": "warning"}, "/healthz")
        cluster = f"bench-{uuid.uuid4().hex[:6]}"
        self.brokers = []
        for broker_id in range(copies):
            bport = free_port()
            env = {"TIDEMQ_BROKER_PORT": str(bport), "TIDEMQ_BROKER_BROKER_ID": str(broker_id),
                   "TIDEMQ_BROKER_BROKER_NAME": "broker-a", "TIDEMQ_BROKER_CLUSTER": cluster,
                   "TIDEMQ_BROKER_DATA_DIR": str(workdir / f"broker-{broker_id}"),
                   "TIDEMQ_BROKER_REDIS_URL": redis_url, "TIDEMQ_BROKER_TOKEN": TOKEN,
                   "TIDEMQ_BROKER_NAMESERVERS": self.ns_url,
                   "TIDEMQ_BROKER_REGISTER_INTERVAL_S": "1", "TIDEMQ_BROKER_GRPC_PORT": "0",
                   "TIDEMQ_BROKER_REPLICAS": str(copies),
                   "TIDEMQ_BROKER_REPLICATION": replication,
                   "TIDEMQ_BROKER_ETCD_ENDPOINTS": url,
                   "TIDEMQ_BROKER_REPLICA_RETRY_MS": "100",
                   "TIDEMQ_BROKER_SEGMENT_BYTES": str(256 * 1024 * 1024),
                   "TIDEMQ_BROKER_LOG_LEVEL": "warning"}
            self.brokers.append(Child(f"broker-{broker_id}",
                                      [sys.executable, "-m", "tidemq_server.broker"], bport,
                                      workdir, env, "/healthz"))
        self.http = httpx.Client(timeout=3.0, headers={"X-Tidemq-Token": TOKEN})

    def start(self) -> None:
        self.etcd.start()
        self.nameserver.start()
        for b in self.brokers:
            b.start(90)

    def stop(self) -> None:
        for child in (*self.brokers, self.nameserver, self.etcd):
            child.stop()
        self.http.close()

    def url(self, broker_id: int) -> str:
        return f"http://127.0.0.1:{self.brokers[broker_id].port}"

    def status(self, broker_id: int) -> dict[str, Any] | None:
        proc = self.brokers[broker_id].proc
        if proc is None or proc.poll() is not None:
            return None
        try:
            resp = self.http.get(self.url(broker_id) + "/internal/v1/replication/status",
                                 timeout=1.0)
        except httpx.HTTPError:
            return None
        return resp.json() if resp.status_code == 200 else None

    def primary(self, newer_than: int = -1, timeout: float = 60.0) -> tuple[int, int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i in range(self.copies):
                st = self.status(i)
                if st and st["role"] == "primary" and not st["deposed"] \
                        and st["epoch"] > newer_than:
                    return i, int(st["epoch"])
            time.sleep(0.05)
        raise TimeoutError("no primary")

    def in_sync(self, primary: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.status(primary)
            if self.copies == 1 or (st and st.get("in_sync_copies") == self.copies):
                return
            time.sleep(0.1)
        raise TimeoutError("copies not in sync")

    def create_topic(self, topic: str) -> None:
        primary, _ = self.primary()
        resp = self.http.put(f"{self.url(primary)}/v1/topics/{topic}", json={"queues": QUEUES})
        resp.raise_for_status()
        self.in_sync(primary)

    def stored_ids(self, broker_id: int, topic: str) -> set[str]:
        ids: set[str] = set()
        for q in range(QUEUES):
            offset = 0
            while True:
                page = self.http.get(f"{self.url(broker_id)}/v1/topics/{topic}/queues/{q}"
                                     "/messages", params={"offset": offset, "max": 1024}).json()
                ids.update(m["message_id"] for m in page["messages"])
                if not page["messages"]:
                    break
                offset = page["next_offset"]
        return ids


async def throughput(group: Group, topic: str, n: int, bodies: list[bytes]) -> float:
    async with Producer(nameservers=[group.ns_url]) as producer:
        await producer.send(bodies[0], topic=topic)  # routes warm
        shares = [n // SENDERS + (1 if w < n % SENDERS else 0) for w in range(SENDERS)]

        async def sender(w: int, share: int) -> None:
            for start in range(0, share, WINDOW):
                k = min(WINDOW, share - start)
                await asyncio.gather(*(producer.send(bodies[(w + start + j) % len(bodies)],
                                                     topic=topic) for j in range(k)))

        t0 = time.perf_counter()
        await asyncio.gather(*(sender(w, s) for w, s in enumerate(shares)))
        return n / (time.perf_counter() - t0)


def outage_s(acks: list[float], signalled: float, recovered: float) -> float:
    """The longest stretch without an acknowledgement between ``signalled`` and
    ``recovered`` (monotonic times; ``acks``: when each send was acknowledged)."""
    points = [signalled, *sorted(t for t in acks if signalled < t <= recovered), recovered]
    return max(b - a for a, b in itertools.pairwise(points))


async def failover(group: Group, topic: str, rounds: int,
                   bodies: list[bytes]) -> dict[str, Any]:
    acked: list[tuple[float, str]] = []  # (monotonic time, id)
    errors: list[str] = []
    stop = asyncio.Event()
    times: dict[str, list[float]] = {"SIGKILL": [], "SIGTERM": []}
    dead_at = [float("inf")]  # sends started after this can only reach the new primary
    recovered = asyncio.Event()
    recovered_at = [0.0]
    async with Producer(nameservers=[group.ns_url]) as producer:
        async def sender(w: int) -> None:
            i = 0
            while not stop.is_set():
                started = time.monotonic()
                try:
                    r = await producer.send(bodies[(w + i) % len(bodies)], topic=topic)
                except Exception as exc:
                    errors.append(repr(exc))
                else:
                    done = time.monotonic()
                    acked.append((done, r.message_id))
                    if started > dead_at[0] and not recovered.is_set():
                        recovered_at[0] = done
                        recovered.set()
                i += 1

        tasks = [asyncio.create_task(sender(w)) for w in range(FAILOVER_SENDERS)]
        plan = [(signal.SIGKILL, "SIGKILL")] * rounds + [(signal.SIGTERM, "SIGTERM")] * rounds
        for n, (sig, name) in enumerate(plan):
            primary, epoch = await asyncio.to_thread(group.primary)
            await asyncio.to_thread(group.in_sync, primary)
            await asyncio.sleep(1.0)
            recovered.clear()
            signalled = time.monotonic()
            await asyncio.to_thread(group.brokers[primary].stop, sig)
            dead_at[0] = time.monotonic()
            await recovered.wait()
            dead_at[0] = float("inf")
            times[name].append(outage_s([t for t, _ in acked], signalled, recovered_at[0]))
            new, _ = await asyncio.to_thread(group.primary, epoch)
            err.print(f"round {n + 1}/{len(plan)}: broker {primary} {name}, broker {new} "
                      f"primary, no acknowledgement for {times[name][-1]:.2f}s")
            await asyncio.to_thread(group.brokers[primary].start, 90)
        stop.set()
        await asyncio.gather(*tasks)
    final, _ = group.primary()
    group.in_sync(final)
    stored = group.stored_ids(final, topic)
    lost = {i for _, i in acked} - stored
    kill, term = times["SIGKILL"], times["SIGTERM"]
    return {"failover_s": kill, "failover_s_p50": statistics.median(kill),
            "failover_s_median": statistics.median(kill), "failover_s_max": max(kill),
            "failover_sigterm_s": term, "failover_sigterm_s_p50": statistics.median(term),
            "failover_sigterm_s_max": max(term), "acked": len(acked), "lost": len(lost),
            "app_errors": len(errors), "error_samples": errors[:3]}


async def bench(quick: bool) -> dict[str, Any]:
    n = 16_000 if quick else 40_000
    rounds = 3 if quick else 10
    bodies = make_bodies(7)
    workdir = Path(tempfile.mkdtemp(prefix="tidemq-bench-repl-"))
    redis = redis_server(workdir / "redis", appendonly=False).start()
    redis_url = f"redis://127.0.0.1:{redis.port}/0"
    rates: dict[str, float] = {}
    cpu: dict[str, dict[str, float]] = {}  # per config: client and all brokers, µs per message
    runs_by: dict[str, list[float]] = {}  # per config: msgs/s of each run
    result: dict[str, Any] = {}
    try:
        for label, copies, mode in CONFIGS:
            group = Group(workdir / label.replace(" ", "-").replace("=", ""), redis_url,
                          copies, mode)
            try:
                await asyncio.to_thread(group.start)
                topic = f"bench-{uuid.uuid4().hex[:6]}"
                await asyncio.to_thread(group.create_topic, topic)
                pids = [b.pid for b in group.brokers]
                client0, brokers0 = time.process_time(), process_cpu_s(pids)
                runs = [await throughput(group, topic, n, bodies)
                        for _ in range(THROUGHPUT_RUNS)]
                rates[label] = max(runs)
                sent = n * THROUGHPUT_RUNS
                cpu[label] = {"client_us_per_msg": (time.process_time() - client0) / sent * 1e6,
                              "brokers_us_per_msg": (process_cpu_s(pids) - brokers0) / sent
                              * 1e6}
                runs_by[label] = runs
                err.print(f"{label}: {', '.join(f'{r:,.0f}' for r in runs)} msgs/s")
                if label == "R=3 sync":
                    result = await failover(group, topic, rounds, bodies)
            finally:
                await asyncio.to_thread(group.stop)
    finally:
        redis.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    base = rates["R=1"]
    return {"messages": n, "rounds": rounds, "body_bytes": BODY_BYTES,
            "msgs_per_s": rates, "runs": runs_by, "cpu": cpu,
            "client_us_per_msg": {k: v["client_us_per_msg"] for k, v in cpu.items()},
            "brokers_us_per_msg": {k: v["brokers_us_per_msg"] for k, v in cpu.items()},
            "sync2_ratio": rates["R=2 sync"] / base,
            "sync3_ratio": rates["R=3 sync"] / base, "async3_ratio": rates["R=3 async"] / base,
            **result, "loop": loop_name()}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    r = run(bench(args.quick))
    base = r["msgs_per_s"]["R=1"]
    rows = [Row(f"produce {label}", r["msgs_per_s"][label], "msgs/s",
                r["msgs_per_s"][label] / base,
                {"R=3 sync": ">= 0.5x", "R=3 async": ">= 0.8x"}.get(label, ""),
                {"R=3 sync": r["sync3_ratio"] >= 0.5,
                 "R=3 async": r["async3_ratio"] >= 0.8}.get(label))
            for label, _, _ in CONFIGS]
    rows += [Row(f"  CPU per message, {label}: client / all brokers",
                 r["client_us_per_msg"][label], "µs",
                 target=f"brokers {r['brokers_us_per_msg'][label]:.1f} µs")
             for label, _, _ in CONFIGS]
    rows += [Row("failover SIGKILL p50", r["failover_s_p50"], "s"),
             Row("failover SIGKILL max", r["failover_s_max"], "s", target="<= 3 s",
                 met=r["failover_s_max"] <= 3.0),
             Row("failover SIGTERM p50", r["failover_sigterm_s_p50"], "s"),
             Row("failover SIGTERM max", r["failover_sigterm_s_max"], "s", target="<= 0.5 s",
                 met=r["failover_sigterm_s_max"] <= 0.5),
             Row("acknowledged during failovers", r["acked"], "msgs"),
             Row("lost", r["lost"], "msgs", target="0", met=r["lost"] == 0),
             Row("application errors", r["app_errors"], "", target="0",
                 met=r["app_errors"] == 0)]
    runs = "; ".join(f"{label} " + ", ".join(f"{v:,.0f}" for v in values)
                     for label, values in r["runs"].items())
    print_table(f"replication: {r['messages']:,} msgs of {BODY_BYTES} B per run, best of "
                f"{THROUGHPUT_RUNS} per config; {r['rounds']} SIGKILL and {r['rounds']} SIGTERM "
                "rounds", rows, caption=f"{r['loop']}; runs (msgs/s): {runs}")
    if args.json:
        print_json(r)
    return 0 if r["lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
