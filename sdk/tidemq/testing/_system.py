"""``TidemqSystem``: a whole tidemq on loopback for an application's tests.

    with TidemqSystem(tmp_path) as system:          # what the ``tidemq_system`` fixture does
        topic = await system.create_topic("Orders")
        async with system.producer() as producer:
            sent = await producer.send(b"hi", topic=topic)
        message = await system.wait_for_message(topic, message_id=sent.message_id)

It starts a managed redis-server (unless given a ``redis_url``), a nameserver, a broker, a
checker and a scheduler, each on a free port, with their data and logs in ``workdir``, and
settings made for tests: short delay levels (``TEST_DELAY_LEVELS``: level 3, where consumer
retries start, waits 300 ms), a checker that scans every second, and a scheduler whose clock a
test may move forward (``advance_clock``: a delay of days is due now). The services come from
the same distribution's server extra (``pip install 'tidemq[server]'``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

from tidemq._producer import Producer
from tidemq._puller import Handler
from tidemq._push_consumer import PushConsumer
from tidemq._transaction import TransactionListener, TransactionProducer
from tidemq.protocol import ReceivedMessage
from tidemq.testing._processes import Child, free_port, redis_child, service_child

#: Delay levels 1-18 of a test system (the default table waits 1 s ... 2 h).
TEST_DELAY_LEVELS = ("100ms 200ms 300ms 400ms 500ms 600ms 700ms 800ms 900ms "
                     "1s 1s 1s 1s 1s 1s 1s 1s 1s")
CHECK_INTERVAL_MS = 1000  # the checker scans this often (check_now() scans at once)
TRANSACTION_TIMEOUT_MS = 1000  # first check of a half message without its own immunity
MAX_RECONSUME_TIMES = 3  # deliveries after the first before a message goes to the DLQ
CONSUMER_HEARTBEAT_S = 1.0  # consumer() rebalances this often (finds %RETRY% topics soon)
WAIT_TIMEOUT_S = 15.0  # default of wait_for_message
_TOKEN_HEADER = "X-Tidemq-Token"


class TidemqSystem:
    """Nameserver, broker, checker, scheduler (and redis-server) as child processes.

    ``settings`` override the services' settings by environment name, e.g.
    ``{"TIDEMQ_BROKER_MAX_RECONSUME_TIMES": "16"}``.
    """

    def __init__(self, workdir: Path, *, redis_url: str | None = None,
                 settings: Mapping[str, str] | None = None) -> None:
        if importlib.util.find_spec("tidemq_server") is None or \
                importlib.util.find_spec("tidemq_server.broker") is None:
            raise RuntimeError("tidemq.testing starts the tidemq services: install them "
                               "with pip install 'tidemq[server]'")
        self.workdir = workdir
        self.token = uuid.uuid4().hex
        self.cluster = f"test-{uuid.uuid4().hex[:8]}"  # its own Redis key space
        ports = {n: free_port() for n in ("redis", "nameserver", "broker", "checker",
                                          "scheduler")}
        self.redis_url = redis_url or f"redis://127.0.0.1:{ports['redis']}/0"
        self.nameserver_url = f"http://127.0.0.1:{ports['nameserver']}"
        self.broker_url = f"http://127.0.0.1:{ports['broker']}"
        self.checker_url = f"http://127.0.0.1:{ports['checker']}"
        self.scheduler_url = f"http://127.0.0.1:{ports['scheduler']}"
        self._children: list[tuple[Child, str]] = []
        if redis_url is None:
            self._children.append((redis_child(workdir, ports["redis"]),
                                   f"tcp://127.0.0.1:{ports['redis']}"))
        common = {"CLUSTER": self.cluster, "TOKEN": self.token, "REDIS_URL": self.redis_url,
                  "LOG_LEVEL": "warning"}
        envs: dict[str, dict[str, str]] = {
            "nameserver": {"TIDEMQ_NAMESRV_PORT": str(ports["nameserver"]),
                           "TIDEMQ_NAMESRV_WARMUP_S": "0"},
            "broker": _prefixed("TIDEMQ_BROKER_", {
                **common, "PORT": str(ports["broker"]), "GRPC_PORT": "0",
                "DATA_DIR": str(workdir / "broker"), "NAMESERVERS": self.nameserver_url,
                "SCHEDULER_URL": self.scheduler_url, "DELAY_LEVELS": TEST_DELAY_LEVELS,
                "MAX_RECONSUME_TIMES": str(MAX_RECONSUME_TIMES), "FLUSH_INTERVAL_MS": "50",
                "SEGMENT_BYTES": str(64 * 1024 * 1024)}),
            "checker": _prefixed("TIDEMQ_CHECKER_", {
                **common, "PORT": str(ports["checker"]), "BROKER_URL": self.broker_url,
                "CHECK_INTERVAL_MS": str(CHECK_INTERVAL_MS),
                "TRANSACTION_TIMEOUT_MS": str(TRANSACTION_TIMEOUT_MS)}),
            "scheduler": _prefixed("TIDEMQ_SCHEDULER_", {
                **common, "PORT": str(ports["scheduler"]), "BROKER_URL": self.broker_url,
                "DATA_DIR": str(workdir / "scheduler"), "TEST_CLOCK": "true"}),
        }
        for name, env in envs.items():
            env.update({k: v for k, v in (settings or {}).items()
                        if k.startswith(_PREFIXES[name])})
            self._children.append((service_child(name, workdir, env),
                                   getattr(self, f"{name}_url") + "/healthz"))

    @property
    def nameservers(self) -> list[str]:
        return [self.nameserver_url]

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Self:
        """Start every process at once (each waits for the ones it talks to) and wait until
        each is healthy."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            for child, _ in self._children:
                child.spawn()
            for child, ready in self._children:
                child.wait_healthy(ready)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every process, the last started first."""
        for child, _ in reversed(self._children):
            child.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def logs(self) -> dict[str, str]:
        """Each process's log so far (for a failing test's report)."""
        return {c.name: c.log_path.read_text(errors="replace") if c.log_path.exists() else ""
                for c, _ in self._children}

    # -- clients -----------------------------------------------------------------------------

    def producer(self, **options: Any) -> Producer:
        """A ``Producer`` of this system (``options`` go to its constructor)."""
        return Producer(nameservers=self.nameservers, **options)

    def transaction_producer(self, group: str, listener: TransactionListener,
                             **options: Any) -> TransactionProducer:
        """A ``TransactionProducer`` that heartbeats and polls for checks often."""
        options = {"heartbeat_interval_s": 1.0, "check_wait_ms": 1000, **options}
        return TransactionProducer(group, listener, nameservers=self.nameservers, **options)

    def consumer(self, group: str, handler: Handler, subscriptions: Mapping[str, str],
                 **options: Any) -> PushConsumer:
        """A ``PushConsumer`` that rebalances every second (it finds its retry topic soon)."""
        options = {"heartbeat_interval_s": CONSUMER_HEARTBEAT_S, "pull_wait_ms": 1000,
                   **options}
        return PushConsumer(group, handler=handler, nameservers=self.nameservers,
                            subscriptions=subscriptions, **options)

    # -- helpers -----------------------------------------------------------------------------

    async def create_topic(self, name: str | None = None, *, queues: int = 4) -> str:
        """Create a topic (a fresh name when none is given) and wait until it is routable."""
        topic = name or f"T-{uuid.uuid4().hex[:10]}"
        async with httpx.AsyncClient(timeout=10.0) as http:
            resp = await http.put(f"{self.broker_url}/v1/topics/{topic}",
                                  json={"queues": queues})
            if resp.status_code != 200:
                raise RuntimeError(f"creating topic {topic!r}: {resp.status_code} {resp.text}")
            deadline = time.monotonic() + 10.0
            while (await http.get(f"{self.nameserver_url}/v1/routes/{topic}")).status_code \
                    != 200:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"topic {topic!r} has no route after 10 s")
                await asyncio.sleep(0.05)
        return topic

    async def wait_for_message(
        self, topic: str, *, message_id: str | None = None,
        match: Callable[[ReceivedMessage], bool] | None = None,
        timeout_s: float = WAIT_TIMEOUT_S,
    ) -> ReceivedMessage:
        """The first message stored in ``topic`` (any queue, from its start) that has
        ``message_id`` and satisfies ``match``; ``TimeoutError`` after ``timeout_s`` seconds.
        It reads the queues without a consumer group, so it moves no group's offsets."""
        wanted = _matcher(message_id, match)
        offsets: dict[int, int] = {}
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=10.0) as http:
            while True:
                answer = (await http.get(f"{self.broker_url}/v1/topics/{topic}")).json()
                for q in answer.get("offsets", []):
                    qid, start = int(q["queue_id"]), int(q["min"])
                    while offsets.get(qid, start) < int(q["max"]):
                        page = (await http.get(
                            f"{self.broker_url}/v1/topics/{topic}/queues/{qid}/messages",
                            params={"offset": offsets.get(qid, start), "max": 256})).json()
                        for raw in page["messages"]:
                            message = ReceivedMessage.from_wire(raw)
                            if wanted(message):
                                return message
                        offsets[qid] = int(page["next_offset"])
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no matching message in {topic!r} after {timeout_s}s")
                await asyncio.sleep(0.05)

    async def check_now(self) -> dict[str, Any]:
        """Run a check-back scan now (instead of waiting for the next one) and return its
        report. Half messages sent with ``check_immunity_s=0`` are checked by it whatever
        their age; others once older than ``TRANSACTION_TIMEOUT_MS``."""
        return await self._internal(self.checker_url, "/internal/v1/scan", {})

    async def advance_clock(self, seconds: float) -> None:
        """Move the scheduler's clock forward: a delayed message due within ``seconds`` from
        now is delivered at once. The clock never moves back: for the rest of the session
        every delay is that much shorter (assert "not early" only in a system of its own)."""
        await self._internal(self.scheduler_url, "/internal/v1/clock",
                             {"advance_ms": int(seconds * 1000)})

    async def _internal(self, base: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=30.0) as http:
            resp = await http.post(base + path, json=body, headers={_TOKEN_HEADER: self.token})
        if resp.status_code != 200:
            raise RuntimeError(f"POST {path}: {resp.status_code} {resp.text}")
        answer: dict[str, Any] = resp.json()
        return answer


_PREFIXES = {"nameserver": "TIDEMQ_NAMESRV_", "broker": "TIDEMQ_BROKER_",
             "checker": "TIDEMQ_CHECKER_", "scheduler": "TIDEMQ_SCHEDULER_"}


def _prefixed(prefix: str, values: Mapping[str, str]) -> dict[str, str]:
    return {prefix + k: v for k, v in values.items()}


def _matcher(message_id: str | None, match: Callable[[ReceivedMessage], bool] | None
             ) -> Callable[[ReceivedMessage], bool]:
    def wanted(message: ReceivedMessage) -> bool:
        if message_id is not None and message.message_id != message_id:
            return False
        return match is None or match(message)
    return wanted
