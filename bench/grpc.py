"""gRPC front door benchmark: the official RocketMQ 5 Python client beside tidemq's SDK over REST.

Run ``python -m bench.grpc [--quick] [--json]``.

One tidemq (redis-server, nameserver, broker with ``flush=async`` and its gRPC front door, all on
free ports, data in a temp dir) serves both clients in the same run, 1 KiB messages, one topic
of 8 queues per client:

1. gRPC send      official ``Producer.send_async`` with 64 sends in flight. The client puts one
                  message in each SendMessage RPC (it has no batching).
2. gRPC receive   official ``SimpleConsumer``: 4 threads, each ``receive(32)`` then ``ack`` per
                  message (one AckMessage RPC per message, as the client does).
3. REST send      tidemq SDK ``Producer``: 64 concurrent senders ``await send`` (the SDK gathers
                  concurrent sends into batch requests, ``linger_ms=1``).
4. REST receive   tidemq SDK ``SimpleConsumer``: 4 tasks, each ``receive(max=32)`` then one
                  ``ack`` of the batch.

The official client runs in a child process (``python -m bench.grpc --client ...``, ``HOME`` in
the temp dir: the client logs under ``$HOME/logs``); the clock starts after its startup. Every
phase checks that all N messages arrived (distinct message ids). No targets: the figures show
what the gRPC door costs against the REST path on this box.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench._common import Row, err, loop_name, print_json, print_table, run

REPO = Path(__file__).resolve().parents[1]
BODY_BYTES = 1024
QUEUES = 8
IN_FLIGHT = 64  # gRPC sends in flight; REST concurrent senders
RECEIVERS = 4  # receive threads (gRPC) / tasks (REST)
BATCH = 32  # messages per receive


@dataclass(frozen=True, slots=True)
class Sizes:
    messages: int


QUICK = Sizes(messages=4_000)
FULL = Sizes(messages=30_000)


# --- the official client, in a child process -----------------------------------------------------

def client_main(mode: str, endpoint: str, topic: str, n: int, group: str) -> dict[str, Any]:
    """``--client send|receive``: the official client's half of a phase, timed after startup."""
    from rocketmq import (  # the official client: only in this child process
        ClientConfiguration,
        Credentials,
        FilterExpression,
        Message,
        Producer,
        SimpleConsumer,
    )

    config = ClientConfiguration(endpoint, Credentials(), request_timeout=10)
    body = os.urandom(BODY_BYTES // 2).hex().encode()
    if mode == "send":
        producer = Producer(config, (topic,))
        producer.startup()
        began = time.perf_counter()
        window: list[Any] = []
        for _ in range(n):
            msg = Message()
            msg.topic, msg.body = topic, body
            window.append(producer.send_async(msg))
            if len(window) >= IN_FLIGHT:
                window.pop(0).result()
        ids = {f.result().message_id for f in window}
        seconds = time.perf_counter() - began
        producer.shutdown()
        return {"n": n, "seconds": seconds, "distinct_tail": len(ids)}
    consumer = SimpleConsumer(config, group, {topic: FilterExpression("*")}, await_duration=2)
    consumer.startup()
    seen: set[str] = set()
    lock = threading.Lock()
    began = time.perf_counter()
    deadline = time.monotonic() + 600

    def work() -> None:
        while time.monotonic() < deadline:
            with lock:
                if len(seen) >= n:
                    return
            for msg in consumer.receive(BATCH, 60):
                consumer.ack(msg)
                with lock:
                    seen.add(msg.message_id)

    threads = [threading.Thread(target=work) for _ in range(RECEIVERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - began
    consumer.shutdown()
    return {"n": len(seen), "seconds": seconds}


def official(workdir: Path, *args: str) -> dict[str, Any]:
    env = {**os.environ, "HOME": str(workdir / "home"), "PYTHONUNBUFFERED": "1"}
    (workdir / "home").mkdir(exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "bench.grpc", "--client", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"official client {args[0]} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# --- the cluster -------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} not listening on {port} after 30 s")


class Cluster:
    """redis-server, nameserver and broker (with gRPC) as child processes."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.ports = {n: free_port() for n in ("redis", "nameserver", "broker", "grpc")}
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    @property
    def broker_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['broker']}"

    @property
    def ns_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['nameserver']}"

    @property
    def grpc_endpoint(self) -> str:
        return f"127.0.0.1:{self.ports['grpc']}"

    def _spawn(self, name: str, argv: Sequence[str], env: dict[str, str], port: int) -> None:
        with open(self.workdir / f"{name}.log", "ab") as log:  # the child keeps its own fd
            proc = subprocess.Popen(list(argv), cwd=REPO, env={**os.environ, **env},
                                    stdout=log, stderr=log)
        self.procs.append((name, proc))
        wait_port(port, proc, name)

    def start(self) -> None:
        p = self.ports
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed")
        (self.workdir / "redis").mkdir()
        self._spawn("redis", [exe, "--port", str(p["redis"]), "--bind", "127.0.0.1", "--dir",
                              str(self.workdir / "redis"), "--save", "", "--appendonly", "no"],
                    {}, p["redis"])
        self._spawn("nameserver", [sys.executable, "-m", "tidemq_server.nameserver"],
                    {"TIDEMQ_NAMESRV_PORT": str(p["nameserver"]),
                     "TIDEMQ_NAMESRV_LOG_LEVEL": "warning"}, p["nameserver"])
        self._spawn("broker", [sys.executable, "-m", "tidemq_server.broker"], {
            "TIDEMQ_BROKER_PORT": str(p["broker"]), "TIDEMQ_BROKER_GRPC_PORT": str(p["grpc"]),
            "TIDEMQ_BROKER_DATA_DIR": str(self.workdir / "broker"),
            "TIDEMQ_BROKER_REDIS_URL": f"redis://127.0.0.1:{p['redis']}/0",
            "TIDEMQ_BROKER_NAMESERVERS": self.ns_url, "TIDEMQ_BROKER_FLUSH": "async",
            "TIDEMQ_BROKER_CLUSTER": f"bench-{uuid.uuid4().hex[:8]}",
            "TIDEMQ_BROKER_LOG_LEVEL": "warning"}, p["broker"])
        wait_port(p["grpc"], self.procs[-1][1], "broker gRPC")

    def stop(self) -> None:
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    def topic(self) -> str:
        name = f"bench-{uuid.uuid4().hex[:8]}"
        httpx.put(f"{self.broker_url}/v1/topics/{name}", json={"queues": QUEUES},
                  timeout=10).raise_for_status()
        return name

    def stored(self, topic: str) -> int:
        r = httpx.get(f"{self.broker_url}/v1/topics/{topic}", timeout=10)
        r.raise_for_status()
        return sum(int(o["max"]) for o in r.json()["offsets"])


# --- tidemq SDK over REST ------------------------------------------------------------------------

async def rest_send(cluster: Cluster, topic: str, n: int) -> dict[str, Any]:
    from tidemq import Producer

    body = os.urandom(BODY_BYTES // 2).hex().encode()
    async with Producer(nameservers=[cluster.ns_url]) as producer:
        await producer.send(body, topic=topic)  # routes and connection warmed up
        left = n - 1
        began = time.perf_counter()

        async def sender() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await producer.send(body, topic=topic)

        await asyncio.gather(*(sender() for _ in range(IN_FLIGHT)))
        seconds = time.perf_counter() - began
    return {"n": n, "seconds": seconds}


async def rest_receive(cluster: Cluster, topic: str, n: int) -> dict[str, Any]:
    from tidemq import SimpleConsumer

    seen: set[str] = set()
    async with SimpleConsumer(f"bench-{uuid.uuid4().hex[:6]}", topic=topic,
                              nameservers=[cluster.ns_url]) as consumer:
        began = time.perf_counter()
        deadline = time.monotonic() + 600

        async def worker() -> None:
            while len(seen) < n and time.monotonic() < deadline:
                batch = await consumer.receive(max=BATCH, wait_ms=1000)
                if batch:
                    await consumer.ack(batch)
                    seen.update(m.message_id for m in batch)

        await asyncio.gather(*(worker() for _ in range(RECEIVERS)))
        seconds = time.perf_counter() - began
    return {"n": len(seen), "seconds": seconds}


# --- the run -------------------------------------------------------------------------------------

def rate(phase: dict[str, Any]) -> float:
    return float(phase["n"]) / phase["seconds"] if phase["seconds"] > 0 else 0.0


def run_all(workdir: Path, sizes: Sizes) -> dict[str, dict[str, Any]]:
    cluster = Cluster(workdir)
    n = sizes.messages
    out: dict[str, dict[str, Any]] = {}
    try:
        cluster.start()
        grpc_topic, rest_topic = cluster.topic(), cluster.topic()
        err.print(f"gRPC send: {n} messages through the official client …")
        out["grpc_send"] = official(workdir, "send", cluster.grpc_endpoint, grpc_topic, str(n))
        err.print("gRPC receive …")
        out["grpc_receive"] = official(workdir, "receive", cluster.grpc_endpoint, grpc_topic,
                                       str(n), f"bench-{uuid.uuid4().hex[:6]}")
        err.print(f"REST send: {n} messages through the tidemq SDK …")
        out["rest_send"] = run(rest_send(cluster, rest_topic, n))
        err.print("REST receive …")
        out["rest_receive"] = run(rest_receive(cluster, rest_topic, n))
        for topic, phase in ((grpc_topic, "grpc_send"), (rest_topic, "rest_send")):
            stored = cluster.stored(topic)
            if stored != n:
                raise RuntimeError(f"{phase}: {topic} holds {stored} messages, expected {n}")
        for phase in ("grpc_receive", "rest_receive"):
            if out[phase]["n"] != n:
                raise RuntimeError(f"{phase}: received {out[phase]['n']} of {n} messages")
    finally:
        cluster.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.grpc", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"{QUICK.messages} messages per phase")
    ap.add_argument("--json", action="store_true",
                    help="print one JSON object with every figure as the last line of stdout")
    ap.add_argument("--messages", type=int, default=None, help="override the message count")
    ap.add_argument("--dir", default=None, help="parent of the scratch directory (default: /tmp)")
    ap.add_argument("--client", nargs="+", help=argparse.SUPPRESS)  # the child's role
    args = ap.parse_args(argv)
    if args.client:
        mode, endpoint, topic, count, *rest = args.client
        print(json.dumps(client_main(mode, endpoint, topic, int(count), *(rest or [""]))),
              flush=True)
        return 0
    sizes = Sizes(args.messages) if args.messages else (QUICK if args.quick else FULL)
    loop = loop_name()
    err.print(f"gRPC bench ({'quick' if args.quick else 'full'}), event loop: {loop}")
    began = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="tidemq-grpc-bench-", dir=args.dir))
    try:
        res = run_all(tmp, sizes)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    total_s = time.perf_counter() - began
    gs, gr = rate(res["grpc_send"]), rate(res["grpc_receive"])
    rs, rr = rate(res["rest_send"]), rate(res["rest_receive"])
    rows = [
        Row(f"gRPC send: official Producer, send_async x {IN_FLIGHT} in flight", gs, "msgs/s",
            gs / rs if rs else None),
        Row(f"REST send: tidemq SDK, {IN_FLIGHT} concurrent senders", rs, "msgs/s", 1.0),
        Row(f"gRPC receive: official SimpleConsumer, {RECEIVERS} threads, receive({BATCH}) + "
            "ack each", gr, "msgs/s", gr / rr if rr else None),
        Row(f"REST receive: tidemq SDK SimpleConsumer, {RECEIVERS} tasks, receive({BATCH}) + "
            "batch ack", rr, "msgs/s", 1.0),
    ]
    print_table(f"tidemq gRPC front door vs REST SDK ({'quick' if args.quick else 'full'})", rows,
                caption=f"{sizes.messages} x {BODY_BYTES} B messages per phase, one broker "
                        f"(flush=async); ratio = against the REST row; event loop {loop}; "
                        f"{total_s:.0f} s in all")
    if args.json:
        print_json({
            "bench": "grpc", "quick": args.quick, "messages": sizes.messages,
            "body_bytes": BODY_BYTES, "event_loop": loop,
            "grpc_send_per_s": gs, "grpc_receive_per_s": gr,
            "rest_sdk_send_per_s": rs, "rest_sdk_receive_per_s": rr,
            "grpc_vs_rest_send_ratio": gs / rs if rs else None,
            "grpc_vs_rest_receive_ratio": gr / rr if rr else None,
            "total_s": total_s,
        })
    return 0


if __name__ == "__main__":
    sys.exit(main())
