"""tidemq on namespace hosts: every service binds and advertises its host's address.

    n1 n2 n3   broker-a, members 0 1 2 (one replicated group; etcd decides who leads)
    n4         broker-b (one copy, its store on a small tmpfs), nameserver-2, checker-b,
               scheduler-b, a Redis sentinel
    n5         etcd, Redis master + sentinel, nameserver-1, checker-a, scheduler-a
    n6         Redis replica + sentinel
    n7         nameserver-1
    c1         the workload (clients)

broker-a's members run with the broker's own lease, margin and election step (2 s, 0.5 s, 0.5 s:
services/broker/settings.py), so the failovers measured are the product's; short check scans (1
s) keep check-backs within seconds. A process runs as ``ip netns exec <host> …``; its log is
``<workdir>/<name>.log``. A service may run under libfaketime (wall clock moved by the clock
nemesis through a file; the monotonic clock untouched, as an NTP step leaves it).
"""

from __future__ import annotations

import functools
import glob
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench._faults.history import RoleSample, now_ms
from bench._faults.netns import Network, sh

HOSTS = ("n1", "n2", "n3", "n4", "n5", "n6", "n7", "c1")
GROUP_A, GROUP_B = "broker-a", "broker-b"
A_HOSTS = ("n1", "n2", "n3")
TOKEN = "faults-token"
CLUSTER = "FaultsCluster"
SENTINEL_PORT = 26379
MASTER = "tidemq"
TMPFS_MB = 48  # broker-b's data directory (the disk nemesis fills it)
SEGMENT_BYTES = 64 * 1024  # small segments: sealed ones exist for the file nemesis
STATUS_PATH = "/internal/v1/replication/status"
GRPC_PORT = 10912  # every broker's gRPC door (the workload's gRPC share)
FAKETIME_GLOB = "/usr/lib/*/faketime/libfaketime.so.1"  # Debian's libfaketime, any architecture


def faketime_lib() -> str:
    found = sorted(glob.glob(FAKETIME_GLOB))
    if not found:
        raise RuntimeError("libfaketime is not installed (scripts/install-system-deps.sh, or "
                           "apt-get install libfaketime): the clock nemesis needs it")
    return found[0]

BROKER_FAST = {  # every broker
    "REGISTER_INTERVAL_S": "1", "FLUSH_INTERVAL_MS": "50", "SEGMENT_BYTES": str(SEGMENT_BYTES),
    "GRPC_PORT": str(GRPC_PORT), "LONG_POLL_MAX_MS": "1000", "RETENTION_INTERVAL_S": "1",
    "LOG_LEVEL": "info", "CHECK_HOLD_S": "5", "MAX_SEND_WAIT_MS": "2000",
}
# broker-b's small disk: no segment deleted under disk pressure (a full disk refuses writes
# instead), so the final read holds every record of the run and nothing is unverifiable
KEEP_EVERYTHING = {"DISK_HIGH_WATER_RATIO": "1"}
REPLICATED = {  # broker-a's members (lease, margin and election step: the broker's defaults)
    "REPLICAS": "3",
    "REPLICA_LAG_MAX_MS": "1500", "REPLICA_FETCH_WAIT_MS": "200", "REPLICA_RETRY_MS": "100",
    "SYNC_ACK_TIMEOUT_MS": "2000",
}


@dataclass
class Proc:
    name: str
    host: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    url: str = ""  # base URL of a service ("" for etcd and Redis)
    clock_file: Path | None = None  # libfaketime's offset file, when the clock is faked

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


@dataclass
class Cluster:
    net: Network
    workdir: Path
    procs: dict[str, Proc] = field(default_factory=dict)
    http: httpx.Client = field(default_factory=lambda: httpx.Client(
        timeout=1.0, headers={"X-Tidemq-Token": TOKEN}))
    mounts: list[Path] = field(default_factory=list)
    # broker-a's lease (s); None: the broker's own default. A longer one for a loaded machine,
    # where the 2 s lease lapses by itself (docs/reliability.md, open findings)
    lease_s: float | None = None

    # --- addresses ------------------------------------------------------------------------
    def ip(self, host: str) -> str:
        return self.net.ip(host)

    def url(self, host: str, port: int) -> str:
        return f"http://{self.ip(host)}:{port}"

    @property
    def nameservers(self) -> list[str]:
        return [self.url("n7", 9876), self.url("n4", 9876)]

    @property
    def grpc_endpoints(self) -> str:
        """Every broker's gRPC door, in the official client's form ("host:port;...")."""
        return ";".join(f"{self.ip(h)}:{GRPC_PORT}" for h in ("n4", *A_HOSTS))

    @property
    def redis_url(self) -> str:
        hosts = ",".join(f"{self.ip(h)}:{SENTINEL_PORT}" for h in ("n5", "n6", "n4"))
        return f"redis+sentinel://{hosts}/{MASTER}/0"

    # --- processes ------------------------------------------------------------------------
    def spawn(self, proc: Proc) -> Proc:
        self.procs[proc.name] = proc
        env = {**os.environ, **proc.env, "PYTHONUNBUFFERED": "1"}
        if proc.clock_file is not None:
            env |= {"LD_PRELOAD": faketime_lib(), "FAKETIME_TIMESTAMP_FILE": str(proc.clock_file),
                    "FAKETIME_CACHE_DURATION": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
        log = open(proc.log, "ab")
        proc.popen = subprocess.Popen(self.net.exec_argv(proc.host, proc.argv), env=env,
                                      stdout=log, stderr=log, cwd=self.workdir)
        log.close()
        return proc

    def service(self, name: str, host: str, module: str, prefix: str, port: int,
                settings: dict[str, str], *, faked_clock: bool = False) -> Proc:
        env = {f"{prefix}HOST": self.ip(host), f"{prefix}PORT": str(port),
               f"{prefix}ADVERTISED_ADDRESS": self.url(host, port),
               f"{prefix}CLUSTER": CLUSTER, f"{prefix}TOKEN": TOKEN,
               **{prefix + k: v for k, v in settings.items()}}
        clock = None
        if faked_clock:
            clock = self.workdir / f"{name}.faketime"
            clock.write_text("+0\n")
        return Proc(name, host, [sys.executable, "-m", module], env,
                    self.workdir / f"{name}.log", url=self.url(host, port), clock_file=clock)

    def signal(self, name: str, sig: int) -> None:
        proc = self.procs[name]
        if proc.alive and proc.popen is not None:
            proc.popen.send_signal(sig)

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        if proc.popen is not None and proc.alive:
            proc.popen.send_signal(signal.SIGCONT)
            proc.popen.kill()
            proc.popen.wait(10)

    def restart(self, name: str, wait: bool = True) -> None:
        proc = self.procs[name]
        self.kill(name)
        self.spawn(proc)
        if wait and proc.url:
            self.wait_healthy(name)

    def wait_healthy(self, name: str, timeout_s: float = 60.0) -> None:
        proc = self.procs[name]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not proc.alive:
                raise RuntimeError(f"{name} exited:\n{tail(proc.log)}")
            try:
                if self.http.get(proc.url + "/healthz").status_code < 500:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{name} not healthy after {timeout_s} s:\n{tail(proc.log)}")

    # --- start ----------------------------------------------------------------------------
    def start(self) -> Cluster:
        self._start_etcd()
        self._start_redis()
        for i, host in enumerate(("n7", "n4")):
            self.spawn(self.service(f"nameserver-{i + 1}", host, "tidemq_server.nameserver",
                                    "TIDEMQ_NAMESRV_", 9876, {
                                        "PEERS": ",".join(self.nameservers),
                                        "BROKER_EXPIRY_S": "10", "WARMUP_S": "2"},
                                    faked_clock=i == 0))
        common = {**BROKER_FAST, "NAMESERVERS": ",".join(self.nameservers),
                  "REDIS_URL": self.redis_url}
        for i, host in enumerate(A_HOSTS):
            data = self.workdir / host / "broker"
            data.mkdir(parents=True, exist_ok=True)
            self.spawn(self.service(f"a{i}", host, "tidemq_server.broker", "TIDEMQ_BROKER_",
                                    10911, {
                **common, **REPLICATED, "BROKER_NAME": GROUP_A, "BROKER_ID": str(i),
                **({"LEASE_S": str(self.lease_s)} if self.lease_s else {}),
                "ETCD_ENDPOINTS": self.url("n5", 2379), "DATA_DIR": str(data),
                "SCHEDULER_URL": self.url("n5", 10931)}, faked_clock=True))
        data_b = self.workdir / "n4" / "broker"
        data_b.mkdir(parents=True, exist_ok=True)
        sh("mount", "-t", "tmpfs", "-o", f"size={TMPFS_MB}m", f"{CLUSTER.lower()}", str(data_b))
        self.mounts.append(data_b)
        self.spawn(self.service("b0", "n4", "tidemq_server.broker", "TIDEMQ_BROKER_", 10911, {
            **common, "BROKER_NAME": GROUP_B, "DATA_DIR": str(data_b), **KEEP_EVERYTHING,
            "SCHEDULER_URL": self.url("n4", 10931)}))
        for group, host in ((GROUP_A, "n5"), (GROUP_B, "n4")):
            side = {"BROKER_NAME": group, "NAMESERVERS": ",".join(self.nameservers),
                    "REDIS_URL": self.redis_url}
            letter = group[-1]
            self.spawn(self.service(f"checker-{letter}", host, "tidemq_server.checker",
                                    "TIDEMQ_CHECKER_", 10921, {
                                        **side, "CHECK_INTERVAL_MS": "1000",
                                        "CHECK_MIN_SLEEP_MS": "200",
                                        "TRANSACTION_TIMEOUT_MS": "2000"}))
            sched = self.workdir / host / f"scheduler-{letter}"
            sched.mkdir(parents=True, exist_ok=True)
            self.spawn(self.service(f"scheduler-{letter}", host, "tidemq_server.scheduler",
                                    "TIDEMQ_SCHEDULER_", 10931, {
                                        **side, "DATA_DIR": str(sched),
                                        "LEVEL_POLL_MS": "100"},
                                    faked_clock=letter == "a"))
        for name in self.procs:  # started together, waited for together
            if self.procs[name].url:
                self.wait_healthy(name, 120)
        return self

    def _start_etcd(self) -> None:
        url, peer = self.url("n5", 2379), self.url("n5", 2380)
        self.spawn(Proc("etcd", "n5", [
            "/usr/bin/etcd", "--name", "faults", "--data-dir", str(self.workdir / "etcd"),
            "--listen-client-urls", url, "--advertise-client-urls", url,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"faults={peer}", "--heartbeat-interval", "50",
            "--election-timeout", "500", "--log-level", "warn"], {},
            self.workdir / "etcd.log", url=""))
        self._wait(lambda: self.http.get(url + "/health").json().get("health") == "true",
                   "etcd")

    def _start_redis(self) -> None:
        master = self.ip("n5")
        for host, extra in (("n5", []), ("n6", ["--replicaof", master, "6379"])):
            d = self.workdir / host / "redis"
            d.mkdir(parents=True, exist_ok=True)
            self.spawn(Proc(f"redis-{host}", host, [
                "redis-server", "--bind", self.ip(host), "--port", "6379", "--dir", str(d),
                "--appendonly", "yes", "--save", "", "--protected-mode", "no", *extra], {},
                self.workdir / f"redis-{host}.log"))
        for host in ("n5", "n6", "n4"):
            conf = self.workdir / f"sentinel-{host}.conf"
            conf.write_text(
                f"bind {self.ip(host)}\nport {SENTINEL_PORT}\nprotected-mode no\n"
                f"sentinel monitor {MASTER} {master} 6379 2\n"
                f"sentinel down-after-milliseconds {MASTER} 1000\n"
                f"sentinel failover-timeout {MASTER} 3000\n")
            self.spawn(Proc(f"sentinel-{host}", host, ["redis-server", str(conf), "--sentinel"],
                            {}, self.workdir / f"sentinel-{host}.log"))
        time.sleep(1.0)

    def redis_master(self) -> str:
        """``redis-n5`` or ``redis-n6``: the master as the sentinels say."""
        for host in ("n5", "n6", "n4"):
            out = sh("redis-cli", "-h", self.ip(host), "-p", str(SENTINEL_PORT), "sentinel",
                     "get-master-addr-by-name", MASTER, check=False).split()
            if out:
                return "redis-n5" if out[0] == self.ip("n5") else "redis-n6"
        raise RuntimeError("no sentinel answered")

    def restart_redis(self, name: str) -> None:
        """Start a killed Redis again, as a replica of the current master (Sentinel would
        reconfigure it anyway; starting it as a master could take writes meanwhile)."""
        proc = self.procs[name]
        master = self.redis_master()
        argv = [a for a in proc.argv]
        if "--replicaof" in argv:
            i = argv.index("--replicaof")
            del argv[i:i + 3]
        if master != name:
            argv += ["--replicaof", self.ip(self.procs[master].host), "6379"]
        proc.argv = argv
        self.spawn(proc)

    def _wait(self, check: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if check():
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{what} not ready after {timeout_s} s")

    # --- looking at brokers ---------------------------------------------------------------
    def status(self, name: str) -> dict[str, Any] | None:
        proc = self.procs[name]
        if not proc.alive:
            return None
        try:
            resp = self.http.get(proc.url + STATUS_PATH, timeout=0.5)
        except httpx.HTTPError:
            return None
        return resp.json() if resp.status_code == 200 else None

    def sample_role(self, name: str) -> RoleSample | None:
        """What member ``name`` says it is, stamped when its answer came."""
        st = self.status(name)
        if st is None:
            return None
        role = "primary" if st["role"] == "primary" and not st["deposed"] else "replica"
        return RoleSample(now_ms(), GROUP_A, self.procs[name].url, role, int(st["epoch"]))

    def sample_roles(self) -> list[RoleSample]:
        return [s for s in map(self.sample_role, ("a0", "a1", "a2")) if s is not None]

    def primary_a(self) -> str | None:
        """The name (a0…a2) of broker-a's primary, by the members' own word."""
        for name in ("a0", "a1", "a2"):
            st = self.status(name)
            if st and st["role"] == "primary" and not st["deposed"]:
                return name
        return None

    def wait_primary_a(self, timeout_s: float = 30.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            name = self.primary_a()
            if name is not None:
                return name
            time.sleep(0.1)
        raise TimeoutError("broker-a has no primary")

    def create_topic(self, topic: str, queues: int) -> None:
        def put(group: str) -> bool:
            name = self.wait_primary_a() if group == "a" else "b0"
            return self.http.put(f"{self.procs[name].url}/v1/topics/{topic}",
                                 json={"queues": queues}, timeout=10).status_code == 200
        for group in ("a", "b"):
            self._wait(functools.partial(put, group), f"topic {topic} on broker-{group}")

    # --- stop -----------------------------------------------------------------------------
    def close(self) -> None:
        for proc in self.procs.values():
            if proc.popen is not None and proc.alive:
                proc.popen.send_signal(signal.SIGCONT)
                proc.popen.terminate()
        for proc in self.procs.values():
            if proc.popen is not None:
                try:
                    proc.popen.wait(10)
                except subprocess.TimeoutExpired:
                    proc.popen.kill()
        for mount in self.mounts:
            sh("umount", "-l", str(mount), check=False)
        self.http.close()


def tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""
