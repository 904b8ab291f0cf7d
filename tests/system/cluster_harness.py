"""Two broker groups behind two nameservers, as real processes, for the SDK's cluster tests.

``run_sdk_groups`` starts the nameservers (each listing all as peers, a broker forgotten
``EXPIRY_S`` after its last heartbeat), then one broker per group (``broker-a``, ``broker-b``)
registered with every nameserver, heartbeating every ``HEARTBEAT_S``. All brokers share one
Redis and one cluster name, so their consumer state lives side by side in the same Redis.
``kill_broker`` / ``start_broker`` SIGKILL a group's broker and bring it back on the same port
over the same data dir; ``kill_nameserver`` stops one nameserver for good.

``Sender`` is an application sending continuously through the SDK: a failed send is counted as
an application error and sent again with the same message id (so the acknowledged set stays
complete for the checks).
"""

from __future__ import annotations

import asyncio
import signal
import string
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from tidemq import Producer, SendResult, TidemqError, new_message_id

from tests.support.broker import TOKEN, unique
from tests.support.procs import ServiceProcess, free_port

HEARTBEAT_S = 0.5  # broker → nameserver heartbeat (s)
EXPIRY_S = 3.0  # a nameserver drops a broker silent this long (s)
ROUTE_REFRESH_S = 1.0  # SDK clients of these tests refresh routes this often (s)


def group_name(i: int) -> str:
    return f"broker-{string.ascii_lowercase[i]}"


@dataclass
class SdkGroups:
    cluster: str
    redis_url: str
    workdir: Path
    nameservers: list[ServiceProcess]
    brokers: dict[str, ServiceProcess] = field(default_factory=dict)
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30.0))

    @property
    def ns_urls(self) -> list[str]:
        return [ns.url for ns in self.nameservers]

    def start_broker(self, name: str) -> None:
        """Start ``name``'s broker, or start it again on its port over its data dir."""
        proc = self.brokers.get(name)
        if proc is not None:
            proc.start()
            return
        port = free_port()
        env = {f"TIDEMQ_BROKER_{k}": str(v) for k, v in {
            "PORT": port, "BROKER_NAME": name, "CLUSTER": self.cluster, "TOKEN": TOKEN,
            "DATA_DIR": self.workdir / f"{name}-data", "REDIS_URL": self.redis_url,
            "NAMESERVERS": ",".join(self.ns_urls), "REGISTER_INTERVAL_S": HEARTBEAT_S,
            "FLUSH_INTERVAL_MS": 50, "SEGMENT_BYTES": 64 * 1024 * 1024,
            "LOG_LEVEL": "info"}.items()}
        self.brokers[name] = ServiceProcess("broker", port, env, self.workdir).start()

    def kill_broker(self, name: str) -> None:
        self.brokers[name].stop(signal.SIGKILL)

    def kill_nameserver(self, index: int) -> None:
        self.nameservers[index].stop(signal.SIGKILL)

    def url(self, name: str) -> str:
        return self.brokers[name].url

    # --- topics and routes ----------------------------------------------------------------------
    def create_topic(self, queues: int = 4) -> str:
        """A topic with ``queues`` queues on every group, routed by every live nameserver."""
        topic = unique("T")
        for name in self.brokers:
            resp = self.http.put(f"{self.url(name)}/v1/topics/{topic}", json={"queues": queues})
            assert resp.status_code == 200, resp.text
        self.wait_route(topic, {name: queues for name in self.brokers})
        return topic

    def route(self, topic: str, ns: ServiceProcess) -> dict[str, int]:
        """Broker name → queues in ``ns``'s route of ``topic`` ({} when it has none)."""
        resp = self.http.get(f"{ns.url}/v1/routes/{quote(topic, safe='')}")
        if resp.status_code != 200:
            return {}
        return {q["broker_name"]: q["queues"] for q in resp.json()["queues"]}

    def wait_route(self, topic: str, expected: dict[str, int], timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        live = [ns for ns in self.nameservers if ns.proc is not None]
        while any(self.route(topic, ns) != expected for ns in live):
            assert time.monotonic() < deadline, f"routes of {topic} never became {expected}"
            time.sleep(0.05)

    # --- what the brokers hold ------------------------------------------------------------------
    def stored(self, topic: str) -> dict[str, list[str]]:
        """Broker name → the body of every message of ``topic`` it stores."""
        out: dict[str, list[str]] = {}
        for name in self.brokers:
            base = f"{self.url(name)}/v1/topics/{quote(topic, safe='')}"
            info = self.http.get(base).json()
            bodies: list[str] = []
            for q in info["offsets"]:
                offset = q["min"]
                while offset < q["max"]:
                    answer = self.http.get(f"{base}/queues/{q['queue_id']}/messages",
                                           params={"offset": offset, "max": 1024}).json()
                    bodies += [m["body"] for m in answer["messages"]]
                    offset = answer["next_offset"]
            out[name] = bodies
        return out

    def committed(self, name: str, group: str, topic: str) -> dict[int, int]:
        resp = self.http.get(f"{self.url(name)}/v1/groups/{group}/offsets",
                             params={"topic": topic})
        assert resp.status_code == 200, resp.text
        return {o["queue_id"]: o["offset"] for o in resp.json()["offsets"]}

    def max_offsets(self, name: str, topic: str) -> dict[int, int]:
        info = self.http.get(f"{self.url(name)}/v1/topics/{quote(topic, safe='')}").json()
        return {o["queue_id"]: o["max"] for o in info["offsets"]}

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{proc.logs()[-3000:]}"
                         for name, proc in self.brokers.items())


@contextmanager
def run_sdk_groups(workdir: Path, redis_url: str, groups: int = 2,
                   nameservers: int = 2) -> Iterator[SdkGroups]:
    with ExitStack() as stack:
        ports = [free_port() for _ in range(nameservers)]
        peers = ",".join(f"http://127.0.0.1:{p}" for p in ports)
        procs = []
        for port in ports:
            env = {f"TIDEMQ_NAMESRV_{k}": str(v) for k, v in {
                "PORT": port, "TOKEN": TOKEN, "BROKER_EXPIRY_S": EXPIRY_S,
                "EXPIRY_CHECK_INTERVAL_S": 0.25, "PEERS": peers,
                "LOG_LEVEL": "warning"}.items()}
            proc = ServiceProcess("nameserver", port, env, workdir).start()
            stack.callback(proc.stop)
            procs.append(proc)
        cluster = SdkGroups(unique("cluster"), redis_url, workdir, procs)
        stack.callback(cluster.http.close)
        for i in range(groups):
            cluster.start_broker(group_name(i))
            stack.callback(cluster.brokers[group_name(i)].stop)
        yield cluster


@dataclass
class Sender:
    """Sends bursts of ``burst`` numbered bodies every ``pause_s`` until ``stop`` is set."""

    producer: Producer
    topic: str
    burst: int = 8
    pause_s: float = 0.02
    acked: list[str] = field(default_factory=list)
    results: list[SendResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # every failure the application saw
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    _seq: int = 0

    async def send(self, body: str) -> None:
        message_id = new_message_id()
        while True:
            try:
                result = await self.producer.send(body, topic=self.topic, message_id=message_id)
            except TidemqError as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.1)
                continue
            self.acked.append(body)
            self.results.append(result)
            return

    async def run(self) -> None:
        while not self.stop.is_set():
            bodies = [str(self._seq + i) for i in range(self.burst)]
            self._seq += self.burst
            await asyncio.gather(*(self.send(b) for b in bodies))
            await asyncio.sleep(self.pause_s)


def duplicates(bodies: list[str]) -> int:
    """Copies beyond the first of every body."""
    return sum(n - 1 for n in Counter(bodies).values() if n > 1)


def summary(**figures: Any) -> str:
    return "cluster figures: " + ", ".join(f"{k}={v}" for k, v in figures.items())
