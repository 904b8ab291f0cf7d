"""Helpers of ``bench.cluster``: a cluster of real processes (one redis-server, nameservers,
one broker process per group) and the broker-loss run (a paced SDK producer and a push consumer
while one group's broker is SIGKILLed and started again).

Nothing here imports pytest or the test tree (see ``bench/_peers.py``).
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import msgpack
import psutil

from bench._common import err
from bench._peers import Child, free_port, redis_server

MSGPACK = {"accept": "application/msgpack"}
QUEUES = 8  # queues per group of every bench topic
READ_MAX = 1024  # messages per raw pull when reading a topic back
WARMUP_S = 1.0  # the first second of the broker-loss run is left out of its baseline rate
REJOIN_CAP_S = 30.0  # the broker-loss run waits this long at most for sends to reach the victim


def group_name(i: int) -> str:
    return f"broker-{chr(ord('a') + i)}"


class Cluster:
    """One redis-server, ``nameservers`` nameservers (each knowing all as peers) and brokers
    added one group at a time, every broker registered with every nameserver. Brokers run with
    their defaults (``flush=async``, heartbeat every 30 s, expiry 120 s) and no gRPC door."""

    def __init__(self, workdir: Path, nameservers: int) -> None:
        self.workdir = workdir
        self.name = f"bench-{uuid.uuid4().hex[:8]}"
        (workdir / "redis-state").mkdir(parents=True, exist_ok=True)
        self.redis = redis_server(workdir / "redis-state", appendonly=True)
        ports = [free_port() for _ in range(nameservers)]
        peers = ",".join(f"http://127.0.0.1:{p}" for p in ports)
        self.nameservers = [
            Child(f"nameserver-{j + 1}", [sys.executable, "-m", "tidemq_server.nameserver"], port,
                  workdir, {"TIDEMQ_NAMESRV_PORT": str(port), "TIDEMQ_NAMESRV_PEERS": peers,
                            "TIDEMQ_NAMESRV_LOG_LEVEL": "warning"}, health="/healthz")
            for j, port in enumerate(ports)]
        self.brokers: dict[str, Child] = {}
        self.http = httpx.Client(timeout=30.0)

    @property
    def ns_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{ns.port}" for ns in self.nameservers]

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.brokers[name].port}"

    def start(self) -> None:
        self.redis.start()
        for ns in self.nameservers:
            ns.start()

    def add_broker(self, name: str) -> Child:
        port = free_port()
        env = {f"TIDEMQ_BROKER_{k}": str(v) for k, v in {
            "PORT": port, "BROKER_NAME": name, "CLUSTER": self.name,
            "DATA_DIR": self.workdir / f"{name}-data",
            "REDIS_URL": f"redis://127.0.0.1:{self.redis.port}/0",
            "NAMESERVERS": ",".join(self.ns_urls), "FLUSH": "async", "GRPC_PORT": 0,
            "LOG_LEVEL": "warning"}.items()}
        child = Child(name, [sys.executable, "-m", "tidemq_server.broker"], port, self.workdir, env,
                      health="/healthz")
        self.brokers[name] = child.start()
        return child

    def stop(self) -> None:
        self.http.close()
        for child in [*self.brokers.values(), *self.nameservers, self.redis]:
            child.stop()

    def broker_cpu_s(self) -> float:
        """CPU seconds (user + system) used so far by every running broker process."""
        total = 0.0
        for child in self.brokers.values():
            if child.pid is None:
                continue
            try:
                t = psutil.Process(child.pid).cpu_times()
            except psutil.Error:
                continue
            total += t.user + t.system
        return total

    # --- topics --------------------------------------------------------------------------------
    def create_topic(self, topic: str, groups: list[str]) -> None:
        """``topic`` with ``QUEUES`` queues on each of ``groups``; waits until every nameserver
        routes it over exactly those groups."""
        for name in groups:
            r = self.http.put(f"{self.url(name)}/v1/topics/{topic}", json={"queues": QUEUES})
            r.raise_for_status()
        want = {name: QUEUES for name in groups}
        deadline = time.monotonic() + 30
        while True:
            routes = [self.route(topic, url) for url in self.ns_urls]
            if all(r == want for r in routes):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"routes of {topic} never became {want}: {routes}")
            time.sleep(0.05)

    def route(self, topic: str, ns_url: str) -> dict[str, int]:
        r = self.http.get(f"{ns_url}/v1/routes/{quote(topic, safe='')}")
        if r.status_code != 200:
            return {}
        return {q["broker_name"]: q["queues"] for q in r.json()["queues"]}

    def queue_ends(self, name: str, topic: str) -> dict[int, int]:
        r = self.http.get(f"{self.url(name)}/v1/topics/{quote(topic, safe='')}")
        r.raise_for_status()
        return {int(o["queue_id"]): int(o["max"]) for o in r.json()["offsets"]}

    def stored_ids(self, name: str, topic: str) -> list[str]:
        """The message id of every message of ``topic`` that ``name`` stores (raw pulls)."""
        base = f"{self.url(name)}/v1/topics/{quote(topic, safe='')}"
        info = self.http.get(base)
        info.raise_for_status()
        ids: list[str] = []
        for q in info.json()["offsets"]:
            offset = q["min"]
            while offset < q["max"]:
                r = self.http.get(f"{base}/queues/{q['queue_id']}/messages",
                                  params={"offset": offset, "max": READ_MAX}, headers=MSGPACK)
                r.raise_for_status()
                answer = msgpack.unpackb(r.content, raw=False)
                ids += [m["message_id"] for m in answer["messages"]]
                offset = answer["next_offset"]
        return ids


# --- the broker-loss run -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class KillPlan:
    rate: float  # offered sends per second, paced
    before_s: float  # steady sending before the kill
    down_s: float  # the broker stays dead this long
    after_s: float  # sending goes on at least this long after the broker is healthy again
    bucket_s: float = 0.5  # ack-rate buckets when looking for the recovery
    full_rate: float = 0.9  # a bucket at >= this share of the offered rate is at full rate


@dataclass(slots=True)
class KillRun:
    acked: dict[str, float] = field(default_factory=dict)  # message id → ack time (monotonic)
    send_s: list[float] = field(default_factory=list)  # send() call to ack, app retries included
    errors: list[str] = field(default_factory=list)  # every failure the application saw
    consumed: Counter[str] = field(default_factory=Counter)  # message id → deliveries
    started: float = 0.0  # the sender started
    killed: float = 0.0
    restarted: float = 0.0  # the broker answered /healthz again
    stopped: float = 0.0  # the sender stopped
    rejoin_s: float | None = None  # restart → first message stored on the victim again


def ack_rates(run: KillRun, plan: KillPlan, start: float, end: float) -> list[float]:
    """Acknowledged sends per second in each whole ``plan.bucket_s`` bucket of [start, end)."""
    counts = [0] * max(1, int((end - start) / plan.bucket_s))
    for at in run.acked.values():
        k = int((at - start) // plan.bucket_s)
        if 0 <= k < len(counts):
            counts[k] += 1
    return [c / plan.bucket_s for c in counts]


def episode_rates(run: KillRun, plan: KillPlan) -> list[float]:
    """Ack rates of the buckets (aligned on the kill) from the kill until the first send
    stored on the victim again (or until the sender stopped when none was)."""
    end = run.stopped
    if run.rejoin_s is not None:
        end = min(end, run.restarted + run.rejoin_s + plan.bucket_s)
    return ack_rates(run, plan, run.killed, end)


def recovery_s(run: KillRun, plan: KillPlan) -> float:
    """Seconds from the kill until acknowledged sends are at full rate again: the end of the
    first stretch of under-rate buckets after the kill; 0 when the first bucket is at full
    rate (the fail-over was quicker than a bucket)."""
    rates = episode_rates(run, plan)
    k = 0
    while k < len(rates) and rates[k] < plan.rate * plan.full_rate:
        k += 1
    return k * plan.bucket_s


def settled_s(run: KillRun, plan: KillPlan) -> float:
    """Seconds from the kill to the end of the last under-rate bucket before the first send
    stored on the victim again: dips while the victim restarts and rejoins count too (and so
    does the noise of a loaded machine: compare with the lowest bucket before the kill)."""
    under = [k for k, rate in enumerate(episode_rates(run, plan))
             if rate < plan.rate * plan.full_rate]
    return (under[-1] + 1) * plan.bucket_s if under else 0.0


def lowest_rates(run: KillRun, plan: KillPlan) -> tuple[float, float]:
    """The lowest bucket's acknowledged-send rate (msgs/s) before the kill (after a warm-up:
    what the loaded machine does without a fault) and from the kill on."""
    before = ack_rates(run, plan, run.started + WARMUP_S, run.killed)
    return min(before), min(ack_rates(run, plan, run.killed, run.stopped))


async def kill_run(cluster: Cluster, victim: str, plan: KillPlan) -> tuple[KillRun, dict[str, Any]]:
    """Send ``plan.rate`` msgs/s through the SDK while a push consumer consumes; SIGKILL
    ``victim``'s broker mid-run and start it again on its port and data dir. A failed send is
    counted as an application error and sent again with the same message id."""
    from tidemq import Producer, PushConsumer, TidemqError, new_message_id

    topic = f"BenchKill{uuid.uuid4().hex[:6]}"
    groups = list(cluster.brokers)
    await asyncio.to_thread(cluster.create_topic, topic, groups)
    run = KillRun()
    body = b"k" * 1024

    async def handler(message: Any) -> None:
        run.consumed[message.message_id] += 1

    consumer = PushConsumer(f"bench-kill-{uuid.uuid4().hex[:6]}", nameservers=cluster.ns_urls,
                            handler=handler, consume_from="first")
    consumer.subscribe(topic)
    producer = Producer(nameservers=cluster.ns_urls)
    pending: set[asyncio.Task[None]] = set()

    async def send_one() -> None:
        message_id = new_message_id()
        began = time.monotonic()
        while True:
            try:
                await producer.send(body, topic=topic, message_id=message_id)
            except TidemqError as exc:
                run.errors.append(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.1)
                continue
            now = time.monotonic()
            run.acked[message_id] = now
            run.send_s.append(now - began)
            return

    async def pace(stop: asyncio.Event) -> None:
        period = 1.0 / plan.rate
        t0 = time.monotonic()
        i = 0
        while not stop.is_set():
            now = time.monotonic()
            while t0 + i * period <= now:
                task = asyncio.create_task(send_one())
                pending.add(task)
                task.add_done_callback(pending.discard)
                i += 1
            await asyncio.sleep(0.005)

    async def watch_rejoin() -> None:
        held = sum((await asyncio.to_thread(cluster.queue_ends, victim, topic)).values())
        while True:
            await asyncio.sleep(0.1)
            try:
                ends = await asyncio.to_thread(cluster.queue_ends, victim, topic)
            except httpx.HTTPError:
                continue
            if sum(ends.values()) > held:
                run.rejoin_s = time.monotonic() - run.restarted
                return

    stop = asyncio.Event()
    await consumer.start()
    await producer.start()
    run.started = time.monotonic()
    sender = asyncio.create_task(pace(stop))
    try:
        await asyncio.sleep(plan.before_s)
        err.print(f"SIGKILL {victim} after {len(run.acked):,} acknowledged sends")
        await asyncio.to_thread(cluster.brokers[victim].stop, signal.SIGKILL)
        run.killed = time.monotonic()
        await asyncio.sleep(plan.down_s)
        await asyncio.to_thread(cluster.brokers[victim].start)
        run.restarted = time.monotonic()
        err.print(f"{victim} healthy again {run.restarted - run.killed:.1f} s after the kill")
        # sending goes on for after_s, and at least until a send lands on the victim again
        # (the producer probes a failed group once its back-off ends) or REJOIN_CAP_S passed
        watcher = asyncio.create_task(watch_rejoin())
        try:
            await asyncio.wait_for(asyncio.shield(watcher), REJOIN_CAP_S)
        except TimeoutError:
            watcher.cancel()
            err.print(f"[yellow]no send reached {victim} again within {REJOIN_CAP_S:.0f} s "
                      "of its restart[/]")
        await asyncio.sleep(max(0.0, run.restarted + plan.after_s - time.monotonic()))
        stop.set()
        run.stopped = time.monotonic()
        await sender
        await asyncio.wait_for(asyncio.gather(*pending), 60)
        deadline = time.monotonic() + 60

        def caught_up() -> bool:  # every acknowledged message consumed at least once
            return run.acked.keys() <= run.consumed.keys()

        while time.monotonic() < deadline and not caught_up():  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # a second delivery of the last messages would show now
    finally:
        stop.set()
        await asyncio.gather(sender, *pending, return_exceptions=True)
        await consumer.close()
        await producer.close()
    stored = Counter[str]()
    for name in groups:
        stored.update(await asyncio.to_thread(cluster.stored_ids, name, topic))
    facts = {
        "stored_total": sum(stored.values()),
        "stored_duplicates": sum(n - 1 for n in stored.values() if n > 1),
        "lost_from_store": len(run.acked.keys() - stored.keys()),
        "sdk_failovers": producer.failovers,
        "sdk_possible_duplicates": producer.possible_duplicates,
    }
    return run, facts
