"""Security benchmark: produce throughput with TLS and ACL on against off, in one run.

Run ``python -m bench.security [--quick] [--json]``.

One redis-server and one broker process at a time (``flush=async``, no nameserver, no gRPC
door), each configuration on its own port and data dir:

  plain     HTTP, no accounts (the default: ``make up``)
  tls       HTTPS with a development CA's certificate (``tidemq_server.cli.certs``); the SDK
            verifies it (``use_ca_bundle``)
  acl       accounts on (the broker's ACL file: default deny, nine accounts with prefix rules;
            the SDK signs every request with an access key and secret key), HTTP; the bench
            checks that an unsigned request is refused (401) first
  acl+tls   both

The client is this one process: the SDK ``Producer`` (pointed at the broker), 64 senders x 16
``send`` in flight sharing N messages of 1 KiB (quick 20k, full 100k) to a topic of 8 queues.
Configurations take turns for R rounds (quick 3, full 5), in alternating order, so a load
change on the shared machine touches all of them; each figure is the best of its rounds (other
processes can only slow a run down; the medians are in the JSON too). Ratios are against
``plain`` of the same run. Also the CPU each configuration costs per 1,000 messages (the
broker process's and this client's, lowest of the rounds; ratio above 1: more CPU than plain),
steadier than throughput when other processes share the cores. ACL rows are "not measured"
when the broker has no ACL setting yet.

Target: ``acl_tls_ratio`` (acl+tls / plain) >= 0.8.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import ssl
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench._common import Row, err, loop_name, print_json, print_table, run
from bench._peers import (
    BODY_BYTES,
    Child,
    Throughput,
    free_port,
    make_bodies,
    redis_server,
    run_senders,
)
from bench._security import TOPIC_PREFIX, AclSetup, acl_setup

SENDERS = 64
WINDOW = 16  # sends in flight per sender
QUEUES = 8
TARGET = 0.8  # acl+tls throughput / plain, at least


@dataclass(frozen=True, slots=True)
class Sizes:
    messages: int
    rounds: int


QUICK = Sizes(20_000, 3)
FULL = Sizes(100_000, 5)


@dataclass(frozen=True, slots=True)
class Config:
    name: str
    tls: bool
    acl: bool


CONFIGS = (Config("plain", False, False), Config("tls", True, False),
           Config("acl", False, True), Config("acl+tls", True, True))


@dataclass
class Bench:
    workdir: Path
    redis_url: str
    pki: Any  # tidemq_server.cli.certs.DevPki
    acl: AclSetup | None
    rates: dict[str, list[float]] = field(default_factory=dict)  # msgs/s per round
    # CPU seconds per 1,000 messages per round: the broker's, and this client's
    broker_cpu: dict[str, list[float]] = field(default_factory=dict)
    client_cpu: dict[str, list[float]] = field(default_factory=dict)

    def broker_env(self, cfg: Config, port: int, data: Path) -> dict[str, str]:
        env = {f"TIDEMQ_BROKER_{k}": str(v) for k, v in {
            "PORT": port, "BROKER_NAME": "broker-a", "CLUSTER": f"bench-{uuid.uuid4().hex[:8]}",
            "DATA_DIR": data, "REDIS_URL": self.redis_url, "FLUSH": "async", "GRPC_PORT": 0,
            "LOG_LEVEL": "warning"}.items()}
        if cfg.tls:
            env |= {"TIDEMQ_BROKER_TLS_CERT": str(self.pki.cert),
                    "TIDEMQ_BROKER_TLS_KEY": str(self.pki.key)}
        if cfg.acl:
            assert self.acl is not None
            env |= self.acl.broker_env
        return env


@contextmanager
def client_env(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the SDK clients built inside, then put them back."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def wait_healthy(url: str, verify: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=1.0, verify=verify).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} not healthy after {timeout_s}s")


async def produce(url: str, topic: str, n: int, bodies: list[bytes],
                  label: str) -> Throughput:
    """Create ``topic`` (as the SDK's HTTP client: signed when accounts are on), then send."""
    from tidemq import Producer
    from tidemq._http import HttpClient

    admin = HttpClient()
    try:
        await admin.call("PUT", f"{url}/v1/topics/{topic}", body={"queues": QUEUES})
    finally:
        await admin.aclose()
    async with Producer(broker_url=url) as producer:
        send = producer.send

        async def send_window(batch: list[bytes]) -> None:
            await asyncio.gather(*(send(b, topic=topic) for b in batch))

        return await run_senders(n, SENDERS, WINDOW, bodies, send_window, label)


def cpu_s(pid: int | None) -> float:
    if pid is None:
        return 0.0
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def one(bench: Bench, cfg: Config, sizes: Sizes, round_no: int, bodies: list[bytes]) -> None:
    """Start a broker in configuration ``cfg``, produce ``sizes.messages``, stop it; record
    the rate and the CPU per 1,000 messages."""
    port = free_port()
    data = bench.workdir / f"{cfg.name.replace('+', '-')}-{round_no}"
    child = Child(f"broker-{cfg.name}-{round_no}", [sys.executable, "-m", "tidemq_server.broker"],
                  port, bench.workdir, bench.broker_env(cfg, port, data))
    url = f"{'https' if cfg.tls else 'http'}://127.0.0.1:{port}"
    verify: Any = ssl.create_default_context(cafile=str(bench.pki.ca)) if cfg.tls else True
    child.start(timeout=30.0)
    try:
        wait_healthy(url, verify)
        topic = f"{TOPIC_PREFIX}{uuid.uuid4().hex[:8]}"
        if cfg.acl:  # accounts are really on: an unsigned request is refused
            refused = httpx.put(f"{url}/v1/topics/{topic}", json={"queues": QUEUES},
                                verify=verify, timeout=10)
            if refused.status_code != 401:
                raise RuntimeError(f"{cfg.name}: an unsigned request got "
                                   f"{refused.status_code}, not 401: ACL is not on")
        env = bench.acl.client_env if cfg.acl and bench.acl is not None else {}
        with client_env(env):
            broker0 = cpu_s(child.pid)
            res = run(produce(url, topic, sizes.messages, bodies,
                              f"{cfg.name} (round {round_no + 1})"))
            broker_s = cpu_s(child.pid) - broker0
        per_k = 1000.0 / sizes.messages
        bench.rates.setdefault(cfg.name, []).append(res.msgs_per_s)
        bench.broker_cpu.setdefault(cfg.name, []).append(broker_s * per_k)
        bench.client_cpu.setdefault(cfg.name, []).append(res.cpu_s * per_k)
    finally:
        child.stop()


def run_all(workdir: Path, sizes: Sizes) -> tuple[Bench, list[Config]]:
    from tidemq import use_ca_bundle

    from tidemq_server.cli.certs import ensure_dev_pki

    pki = ensure_dev_pki(workdir / "pki")
    use_ca_bundle(str(pki.ca))  # the SDK verifies the broker's certificate
    redis = redis_server(workdir / "redis", appendonly=False)
    (workdir / "redis").mkdir(parents=True, exist_ok=True)
    redis.start()
    try:
        bench = Bench(workdir, f"redis://127.0.0.1:{redis.port}/0", pki, acl_setup(workdir))
        configs = [c for c in CONFIGS if not c.acl or bench.acl is not None]
        bodies = make_bodies(7)
        for r in range(sizes.rounds):
            order = configs if r % 2 == 0 else list(reversed(configs))
            for cfg in order:
                one(bench, cfg, sizes, r, bodies)
        return bench, configs
    finally:
        redis.stop()
        use_ca_bundle(None)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.security", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="20k messages, 3 rounds")
    ap.add_argument("--json", action="store_true",
                    help="print one JSON object with every figure as the last line of stdout")
    ap.add_argument("--messages", type=int, default=None, help="override the message count")
    args = ap.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.messages:
        sizes = Sizes(args.messages, sizes.rounds)
    loop = loop_name()
    mode = "quick" if args.quick else "full"
    err.print(f"security bench ({mode}), event loop: {loop}")
    began = time.perf_counter()
    load_before = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="tidemq-security-bench-"))
    try:
        bench, configs = run_all(tmp, sizes)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    total_s = time.perf_counter() - began
    med = {name: statistics.median(rates) for name, rates in bench.rates.items()}
    best = {name: max(rates) for name, rates in bench.rates.items()}
    plain = best["plain"]
    ratios = {name: ratio(best.get(name), plain) for name in ("tls", "acl", "acl+tls")}
    median_ratios = {name: ratio(med.get(name), med["plain"]) for name in ratios}
    rows = []
    for cfg in CONFIGS:
        rate = best.get(cfg.name)
        if rate is None:
            rows.append(Row(f"produce, {cfg.name}: not measured (the broker has no ACL yet)",
                            None, "msgs/s", target=f">= {TARGET}x"
                            if cfg.name == "acl+tls" else ""))
            continue
        r = ratios.get(cfg.name)
        target = f">= {TARGET}x" if cfg.name in ("acl+tls", "tls") else ""
        met = None if not target or r is None else r >= TARGET
        rows.append(Row(f"produce, {cfg.name}", rate, "msgs/s", r, target, met))
    for cfg in configs:  # CPU per message: steadier than throughput on a shared machine
        cpu = min(bench.broker_cpu[cfg.name]) * 1000
        rows.append(Row(f"broker CPU per 1k msgs, {cfg.name}", cpu, "ms",
                        ratio(cpu, min(bench.broker_cpu["plain"]) * 1000)))
    for cfg in configs:
        cpu = min(bench.client_cpu[cfg.name]) * 1000
        rows.append(Row(f"client CPU per 1k msgs, {cfg.name}", cpu, "ms",
                        ratio(cpu, min(bench.client_cpu["plain"]) * 1000)))
    print_table(f"tidemq security bench ({mode})", rows, caption="\n".join([
        f"{sizes.messages:,} messages of {BODY_BYTES} B per run, {SENDERS} senders x {WINDOW} "
        f"in flight, one broker (flush=async) per run, best of {sizes.rounds} rounds; "
        f"ratio against plain of the same run; event loop {loop}; {os.cpu_count()} CPUs "
        f"shared by every process; load average (1 min) {load_before:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after; total {total_s:.0f} s",
        "TLS: ECDSA P-256 development certificate, verified by the SDK"
        + ("" if bench.acl else "; ACL: not measured (no ACL setting in this broker)"),
    ]))
    if args.json:
        print_json({
            "bench": "security", "quick": args.quick, "event_loop": loop,
            "messages": sizes.messages, "rounds": sizes.rounds, "body_bytes": BODY_BYTES,
            "msgs_per_s": best, "median_msgs_per_s": med, "runs": bench.rates,
            "median_ratios": median_ratios,
            "broker_cpu_ms_per_1k": {k: min(v) * 1000 for k, v in bench.broker_cpu.items()},
            "client_cpu_ms_per_1k": {k: min(v) * 1000 for k, v in bench.client_cpu.items()},
            "tls_ratio": ratios["tls"], "acl_ratio": ratios["acl"],
            "acl_tls_ratio": ratios["acl+tls"],
            "acl_measured": bench.acl is not None, "configs": [c.name for c in configs],
            "total_s": total_s,
        })
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
