"""Several broker groups found through nameservers, as real processes on loopback.

``run_groups`` starts M nameservers and N groups (``broker-a``, ``broker-b``, ...), each a broker
registered with every nameserver plus its own checker and scheduler configured ONLY by
``broker_name`` + ``nameservers``: their ``broker_url`` points at a port nothing listens on, so
a test passes only if they really find their broker through the nameservers. Brokers heartbeat
every ``HEARTBEAT_S`` and nameservers forget a silent one after ``EXPIRY_S``.

``GroupProcs.kill_broker`` / ``start_broker(port=...)`` SIGKILL a group's broker and bring it
back on the same or another port over the same data dir. ``CheckAnswerer`` is a transactional
producer speaking the REST API directly (heartbeat + check long poll) in a thread: it survives
a broker restart and follows a broker that moved (``url`` is a callable).
"""

from __future__ import annotations

import itertools
import signal
import string
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.support.broker import TOKEN, unique
from tests.support.clock import now_ms
from tests.support.procs import ServiceProcess, free_port
from tests.support.wait import wait_until

HEARTBEAT_S = 0.5  # broker → nameserver heartbeat in these tests (s)
EXPIRY_S = 4.0  # nameservers drop a broker silent this long (s)
CHECK_INTERVAL_MS = 300  # checker scans this often (ms)
IMMUNITY_MS = 800  # a half message is first checked this long after it was stored (ms)
DEAD_URL = "http://127.0.0.1:9"  # broker_url of checkers and schedulers: nothing listens here
AUTH = {"X-Tidemq-Token": TOKEN}
FAST_SCHEDULER = {"TICK_MS": "50", "LEVEL_POLL_MS": "50", "CHECKPOINT_INTERVAL_MS": "200",
                  "PROGRESS_INTERVAL_MS": "200", "INTAKE_WAIT_MS": "500"}


def group_name(i: int) -> str:
    return f"broker-{string.ascii_lowercase[i]}"


@dataclass
class GroupProcs:
    """One broker group: its broker, checker and scheduler."""

    name: str
    cluster: str
    workdir: Path
    redis_url: str
    nameservers: str
    grpc: bool
    scheduler_port: int = field(default_factory=free_port)
    broker: ServiceProcess | None = None
    checker: ServiceProcess | None = None
    scheduler: ServiceProcess | None = None
    grpc_port: int = 0
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30.0))

    @property
    def data_dir(self) -> Path:
        return self.workdir / f"{self.name}-data"

    @property
    def url(self) -> str:
        assert self.broker is not None
        return self.broker.url

    def start_broker(self, port: int | None = None) -> ServiceProcess:
        """Start the broker (again) over the same data dir, on ``port`` or a free one."""
        port = port or free_port()
        if self.grpc and not self.grpc_port:
            self.grpc_port = free_port()
        env = {f"TIDEMQ_BROKER_{k}": str(v) for k, v in {
            "PORT": port, "BROKER_NAME": self.name, "CLUSTER": self.cluster, "TOKEN": TOKEN,
            "DATA_DIR": self.data_dir, "REDIS_URL": self.redis_url,
            "NAMESERVERS": self.nameservers, "REGISTER_INTERVAL_S": HEARTBEAT_S,
            "SCHEDULER_URL": f"http://127.0.0.1:{self.scheduler_port}",
            "FLUSH_INTERVAL_MS": 50, "SEGMENT_BYTES": 64 * 1024 * 1024,
            "GRPC_PORT": self.grpc_port, "LOG_LEVEL": "info"}.items()}
        self.broker = ServiceProcess("broker", port, env, self.workdir).start()
        return self.broker

    def kill_broker(self) -> None:
        assert self.broker is not None
        self.broker.stop(signal.SIGKILL)

    def start_sidecars(self, checker: dict[str, str] | None = None,
                       scheduler: dict[str, str] | None = None) -> None:
        common = {"CLUSTER": self.cluster, "TOKEN": TOKEN, "REDIS_URL": self.redis_url,
                  "BROKER_NAME": self.name, "NAMESERVERS": self.nameservers,
                  "BROKER_URL": DEAD_URL, "LOG_LEVEL": "info"}
        port = free_port()
        env = {**common, "PORT": str(port), "CHECK_INTERVAL_MS": str(CHECK_INTERVAL_MS),
               "TRANSACTION_TIMEOUT_MS": str(IMMUNITY_MS), **(checker or {})}
        self.checker = ServiceProcess("checker", port, {f"TIDEMQ_CHECKER_{k}": v
                                                        for k, v in env.items()},
                                      self.workdir).start()
        env = {**common, "PORT": str(self.scheduler_port), **FAST_SCHEDULER,
               "DATA_DIR": str(self.workdir / f"{self.name}-scheduler"), **(scheduler or {})}
        self.scheduler = ServiceProcess("scheduler", self.scheduler_port,
                                        {f"TIDEMQ_SCHEDULER_{k}": v for k, v in env.items()},
                                        self.workdir).start()

    def stop(self) -> None:
        for proc in (self.checker, self.scheduler, self.broker):
            if proc is not None:
                proc.stop()
        self.http.close()

    # --- requests -----------------------------------------------------------------------------
    def create_topic(self, topic: str, queues: int = 2) -> None:
        resp = self.http.put(f"{self.url}/v1/topics/{topic}", json={"queues": queues})
        assert resp.status_code == 200, resp.text

    def send(self, topic: str, message: dict[str, Any]) -> dict[str, Any]:
        resp = self.http.post(f"{self.url}/v1/topics/{topic}/messages",
                              json={"messages": [message]})
        assert resp.status_code == 200, resp.text
        result: dict[str, Any] = resp.json()["results"][0]
        return result

    def half(self, group: str, topic: str, body: str, immunity_s: int | None = None
             ) -> dict[str, Any]:
        payload: dict[str, Any] = {"producer_group": group, "topic": topic,
                                   "message": {"body": body}}
        if immunity_s is not None:
            payload["check_immunity_s"] = immunity_s
        resp = self.http.post(f"{self.url}/v1/transactions", json=payload)
        assert resp.status_code == 200, resp.text
        answer: dict[str, Any] = resp.json()
        return answer

    def state(self, message_id: str) -> str:
        resp = self.http.get(f"{self.url}/v1/messages/{message_id}")
        assert resp.status_code == 200, resp.text
        return str(resp.json()["state"])

    def messages(self, topic: str, queues: int = 2) -> list[dict[str, Any]]:
        """Every message stored in the topic's queues on this group."""
        out: list[dict[str, Any]] = []
        for q in range(queues):
            resp = self.http.get(f"{self.url}/v1/topics/{topic}/queues/{q}/messages",
                                 params={"offset": 0, "max": 1024})
            assert resp.status_code == 200, resp.text
            out.extend(resp.json()["messages"])
        return out

    def logs(self) -> str:
        return "\n".join(f"--- {self.name} {p.name}\n{p.logs()[-3000:]}"
                         for p in (self.broker, self.checker, self.scheduler) if p is not None)


@dataclass
class Groups:
    cluster: str
    nameservers: list[ServiceProcess]
    groups: dict[str, GroupProcs]

    @property
    def nameserver_urls(self) -> str:
        return ",".join(ns.url for ns in self.nameservers)

    def cluster_view(self) -> dict[str, Any]:
        resp = httpx.get(self.nameservers[0].url + "/v1/cluster", timeout=10.0)
        assert resp.status_code == 200, resp.text
        return {b["broker_name"]: b for b in resp.json()["brokers"]}

    def logs(self) -> str:
        return "\n".join(g.logs() for g in self.groups.values())


@contextmanager
def run_groups(workdir: Path, redis_url: str, groups: int = 2, nameservers: int = 1, *,
               grpc: bool = False, sidecars: bool = True, checker: dict[str, str] | None = None,
               scheduler: dict[str, str] | None = None) -> Iterator[Groups]:
    """Nameservers, then every group's broker, then its checker and scheduler (``checker`` /
    ``scheduler``: more ``TIDEMQ_CHECKER_*`` / ``TIDEMQ_SCHEDULER_*`` settings, without the
    prefix)."""
    cluster = unique("cluster")
    with ExitStack() as stack:
        ports = [free_port() for _ in range(nameservers)]
        peers = ",".join(f"http://127.0.0.1:{p}" for p in ports)
        names: list[ServiceProcess] = []
        for port in ports:
            ns = ServiceProcess("nameserver", port, {f"TIDEMQ_NAMESRV_{k}": str(v) for k, v in {
                "PORT": port, "TOKEN": TOKEN, "BROKER_EXPIRY_S": EXPIRY_S,
                "EXPIRY_CHECK_INTERVAL_S": 0.5, "PEERS": peers}.items()}, workdir).start()
            stack.callback(ns.stop)
            names.append(ns)
        running: dict[str, GroupProcs] = {}
        for i in range(groups):
            group = GroupProcs(group_name(i), cluster, workdir, redis_url, peers, grpc)
            stack.callback(group.stop)
            group.start_broker()
            if sidecars:
                group.start_sidecars(checker, scheduler)
            running[group.name] = group
        yield Groups(cluster, names, running)


class CheckAnswerer:
    """A producer of ``group`` answering every check with ``answer``, over REST, in a thread.
    ``url()`` is asked before every request, so it follows a broker that moved; failed requests
    are retried every 0.2 s (the broker may be down)."""

    def __init__(self, url: Callable[[], str], group: str, answer: str = "commit") -> None:
        self.url = url
        self.group = group
        self.answer = answer
        self.client_id = f"answerer-{uuid.uuid4().hex[:8]}"
        self.answered: list[tuple[str, int]] = []  # (transaction id, wall ms of the answer)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=self.client_id)
        self._http = httpx.Client(timeout=10.0)
        self._beat = 0.0

    def __enter__(self) -> CheckAnswerer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(15)
        self._http.close()

    def answered_ids(self) -> set[str]:
        return {txid for txid, _ in self.answered}

    def answer_ms(self, txid: str, timeout: float = 15.0) -> int:
        """When this answerer's end of ``txid`` was acknowledged (wall ms). The broker commits
        before its answer reaches this thread, so a test that saw the commit waits here for
        the answerer to record it; a check answered by another answerer never shows up."""
        wait_until(lambda: txid in self.answered_ids(), timeout,
                   f"{self.client_id} to record its answer to {txid}")
        return dict(self.answered)[txid]

    def _run(self) -> None:
        for _ in itertools.count():
            if self._stop.is_set():
                return
            try:
                self._once()
            except (httpx.HTTPError, AssertionError, KeyError, ValueError):
                self._stop.wait(0.2)

    def _once(self) -> None:
        base = self.url()
        if time.monotonic() - self._beat >= 0.5:
            resp = self._http.post(f"{base}/v1/producers/{self.group}/heartbeat",
                                   json={"client_id": self.client_id})
            assert resp.status_code == 200, resp.text
            self._beat = time.monotonic()
        resp = self._http.get(f"{base}/v1/producers/{self.group}/checks",
                              params={"client_id": self.client_id, "wait_ms": 500})
        assert resp.status_code == 200, resp.text
        for check in resp.json()["checks"]:
            txid = check["transaction_id"]
            end = self._http.post(f"{base}/v1/transactions/{txid}/end",
                                  json={"producer_group": self.group, "action": self.answer,
                                        "from_check": True})
            if end.status_code == 200:
                self.answered.append((txid, now_ms()))
