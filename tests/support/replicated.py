"""A replicated broker group with etcd-decided failover, as real processes: etcd, a nameserver
and ``copies`` brokers of one group (``broker-a``), with a short lease so failovers are quick.

Each broker keeps its port and data dir across restarts, so a killed member comes back as the
same member. ``primary()`` asks the members themselves (``/internal/v1/replication/status``).
With ``relayed=True`` the members reach each other (replication, the etcd claims) through one
``Relay`` per broker (``relays[broker_id]``, its internal address): cutting one cuts that
member off from the others' fetches while it, etcd and the test's own requests go on.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.support.broker import TOKEN, unique
from tests.support.etcd import EtcdServer
from tests.support.procs import ServiceProcess, free_port
from tests.support.relay import Relay
from tests.support.wait import wait_until

LEASE_S = 2  # the primary's etcd lease in these tests (s)
# The longest wait for a (new) primary (s): generous, for a loaded machine; how long an
# election takes is a figure of bench/replication.py (failover), never a test's bound.
ELECTION_WAIT_S = 60.0
GROUP = "broker-a"
STATUS_PATH = "/internal/v1/replication/status"




@dataclass
class ReplicatedGroup:
    workdir: Path
    redis_url: str
    etcd: EtcdServer
    nameserver: ServiceProcess
    copies: int
    env: dict[str, str]
    brokers: list[ServiceProcess] = field(default_factory=list)
    relayed: bool = False
    relays: list[Relay] = field(default_factory=list)
    http: httpx.Client = field(default_factory=lambda: httpx.Client(
        timeout=3.0, headers={"X-Tidemq-Token": TOKEN}))

    def broker_env(self, broker_id: int, port: int) -> dict[str, str]:
        return {
            **self.env,
            "TIDEMQ_BROKER_PORT": str(port),
            "TIDEMQ_BROKER_BROKER_ID": str(broker_id),
            "TIDEMQ_BROKER_DATA_DIR": str(self.workdir / f"broker-{broker_id}"),
        }

    def start(self) -> None:
        for broker_id in range(self.copies):
            port = free_port()
            env = self.broker_env(broker_id, port)
            if self.relayed:
                self.relays.append(Relay(port))
                env["TIDEMQ_BROKER_INTERNAL_ADDRESS"] = self.relays[-1].url
            proc = ServiceProcess("broker", port, env, self.workdir)
            self.brokers.append(proc)
        # all at once (each start waits for its /healthz): the election waits for none
        with ThreadPoolExecutor(len(self.brokers)) as pool:
            list(pool.map(lambda proc: proc.start(), self.brokers))

    def status(self, broker_id: int) -> dict[str, Any] | None:
        proc = self.brokers[broker_id]
        if proc.proc is None or proc.proc.poll() is not None:
            return None
        try:
            resp = self.http.get(proc.url + STATUS_PATH, timeout=1.0)
        except httpx.HTTPError:
            return None
        return resp.json() if resp.status_code == 200 else None

    def primary(self) -> tuple[int, int] | None:
        """(broker_id, epoch) of the live member that is primary, not deposed, in sync."""
        for broker_id in range(self.copies):
            st = self.status(broker_id)
            if st and st["role"] == "primary" and not st["deposed"]:
                return broker_id, int(st["epoch"])
        return None

    def wait_primary(self, timeout: float = ELECTION_WAIT_S,
                     newer_than: int = 0) -> tuple[int, int]:
        found: tuple[int, int] = wait_until(
            lambda: (p if (p := self.primary()) and p[1] > newer_than else None),
            timeout, f"a primary of {GROUP} past epoch {newer_than}")
        return found

    def create_topic(self, topic: str, queues: int) -> None:
        """``topic`` created at the primary, once every copy holds it."""
        primary, _ = self.wait_primary()
        resp = self.http.put(f"{self.brokers[primary].url}/v1/topics/{topic}",
                             json={"queues": queues})
        assert resp.status_code == 200, resp.text
        wait_until(lambda: all(self._holds(i, topic) for i in range(self.copies)), 15,
                   f"topic {topic} on every copy")

    def _holds(self, broker_id: int, topic: str) -> bool:
        try:
            url = f"{self.brokers[broker_id].url}/v1/topics/{topic}"
            return self.http.get(url).status_code == 200
        except httpx.HTTPError:
            return False

    def routed_primary(self) -> str | None:
        """The primary address the nameserver routes to (None when none)."""
        resp = self.http.get(self.nameserver.url + "/v1/cluster")
        for b in resp.json()["brokers"]:
            if b["role"] == "primary":
                return str(b["address"])
        return None

    def kill(self, broker_id: int, sig: int = signal.SIGKILL) -> None:
        self.brokers[broker_id].stop(sig)

    def restart(self, broker_id: int) -> None:
        proc = self.brokers[broker_id]
        proc.stop()
        proc.start()

    def revive(self, broker_id: int) -> None:
        """Start a stopped (killed) member again: it rejoins as a replica."""
        self.brokers[broker_id].start()

    def logs(self) -> str:
        return "\n".join(f"--- broker {i}\n{p.logs()[-3000:]}" for i, p in
                         enumerate(self.brokers))

    def close(self) -> None:
        for proc in self.brokers:
            proc.stop()
        for relay in self.relays:
            relay.close()
        self.http.close()


@contextmanager
def run_replicated_group(workdir: Path, redis_url: str, copies: int = 3, *,
                         relayed: bool = False, **settings: Any) -> Iterator[ReplicatedGroup]:
    """etcd + a nameserver + ``copies`` brokers of one group; ``settings`` become
    ``TIDEMQ_BROKER_*`` variables of every broker; ``relayed``: see the module docstring."""
    cluster = unique("cluster")
    with ExitStack() as stack:
        etcd = EtcdServer(workdir / "etcd").start()
        stack.callback(etcd.stop)
        ns_port = free_port()
        nameserver = ServiceProcess("nameserver", ns_port, {
            "TIDEMQ_NAMESRV_PORT": str(ns_port), "TIDEMQ_NAMESRV_TOKEN": TOKEN,
            "TIDEMQ_NAMESRV_BROKER_EXPIRY_S": "30"}, workdir).start()
        stack.callback(nameserver.stop)
        env = {
            "TIDEMQ_BROKER_BROKER_NAME": GROUP,
            "TIDEMQ_BROKER_CLUSTER": cluster,
            "TIDEMQ_BROKER_REDIS_URL": redis_url,
            "TIDEMQ_BROKER_TOKEN": TOKEN,
            "TIDEMQ_BROKER_NAMESERVERS": nameserver.url,
            "TIDEMQ_BROKER_REGISTER_INTERVAL_S": "1",
            "TIDEMQ_BROKER_REPLICAS": str(copies),
            "TIDEMQ_BROKER_ETCD_ENDPOINTS": etcd.url,
            "TIDEMQ_BROKER_LEASE_S": str(LEASE_S),
            "TIDEMQ_BROKER_LEASE_MARGIN_S": "0.5",
            "TIDEMQ_BROKER_ELECTION_INTERVAL_S": "0.25",
            "TIDEMQ_BROKER_REPLICA_RETRY_MS": "100",
            "TIDEMQ_BROKER_REPLICA_FETCH_WAIT_MS": "200",
            "TIDEMQ_BROKER_FLUSH_INTERVAL_MS": "50",
            "TIDEMQ_BROKER_SEGMENT_BYTES": str(64 * 1024 * 1024),
            "TIDEMQ_BROKER_LONG_POLL_MAX_MS": "500",
            "TIDEMQ_BROKER_LOG_LEVEL": "info",
        }
        env.update({f"TIDEMQ_BROKER_{k.upper()}": str(v) for k, v in settings.items()})
        group = ReplicatedGroup(workdir, redis_url, etcd, nameserver, copies, env,
                                relayed=relayed)
        stack.callback(group.close)
        group.start()
        yield group
