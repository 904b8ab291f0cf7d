"""End-to-end harness for the SDK tests: a real nameserver and broker, plus helpers.

``run_cluster`` starts ``python -m tidemq_server.nameserver`` and
``python -m tidemq_server.broker`` (the broker registered with that nameserver) on free ports; SDK
clients find the broker through the nameserver's routes, as applications do. ``ConsumerProcess``
runs a ``PushConsumer`` in a child process (this module's ``__main__``) so that a test can
SIGKILL it: its heartbeats stop and the broker's member expiry drops it, which no in-process
cancellation can imitate faithfully.

Processing events carry ``time.monotonic()``; on Linux that clock is system-wide, so the events
of a child process and of the test process can be compared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from tidemq import (
    ConsumeResult,
    Producer,
    PushConsumer,
    ReceivedMessage,
    TidemqError,
    new_message_id,
)

from tests.support.broker import BrokerHandle, run_broker, unique
from tests.support.procs import REPO, ServiceProcess, free_port

__all__ = ["FAST_CONSUMER", "ConsumerProcess", "Flow", "Processed", "Recorder", "SdkCluster",
           "repeated", "run_cluster", "unique"]

#: PushConsumer settings for tests: heartbeat (and rebalance), commits and long polls are short.
FAST_CONSUMER: dict[str, Any] = {
    "heartbeat_interval_s": 0.3,
    "offset_commit_interval_s": 0.2,
    "pull_wait_ms": 500,
    "close_timeout_s": 5.0,
    "local_retry_pause_s": 0.2,
    "orderly_retry_pause_s": 0.05,
}


@dataclass(frozen=True, slots=True)
class Processed:
    """One handler call: which message, by which consumer, when (``time.monotonic()``)."""

    body: str
    message_id: str
    consumer: str
    at: float
    reconsume_times: int = 0


def repeated(events: list[Processed]) -> list[Processed]:
    """Every event processing a body that an earlier event (by time) already processed."""
    seen: set[str] = set()
    out = []
    for event in sorted(events, key=lambda e: e.at):
        if event.body in seen:
            out.append(event)
        seen.add(event.body)
    return out


@dataclass(slots=True)
class Recorder:
    """Collects handler calls of in-process consumers (and read back from child processes)."""

    events: list[Processed] = field(default_factory=list)

    def handler(self, consumer: str) -> Callable[[ReceivedMessage], Awaitable[ConsumeResult]]:
        async def handle(message: ReceivedMessage) -> ConsumeResult:
            self.events.append(Processed(message.text, message.message_id, consumer,
                                         time.monotonic(), message.reconsume_times))
            return ConsumeResult.SUCCESS
        return handle

    def bodies(self) -> set[str]:
        return {e.body for e in self.events}


@dataclass
class Flow:
    """A producer sending bursts of ``burst`` messages every ``pause_s`` until stopped.

    Bodies are sequence numbers. With ``resend``, a failed send is retried by the application
    with the same message id (idempotent), as the SDK documents; without, a failure ends the
    flow with that exception.
    """

    producer: Producer
    topic: str
    resend: bool = False
    burst: int = 8
    pause_s: float = 0.05
    acked: list[str] = field(default_factory=list)
    acked_at: list[float] = field(default_factory=list)  # time.monotonic() of each ack
    failures: int = 0  # sends that failed and were sent again
    stopped: asyncio.Event = field(default_factory=asyncio.Event)

    async def send(self, body: str) -> None:
        message_id = new_message_id()
        while True:
            try:
                await self.producer.send(body, topic=self.topic, message_id=message_id)
            except TidemqError:
                if not self.resend:
                    raise
                self.failures += 1
                await asyncio.sleep(0.1)
                continue
            self.acked.append(body)
            self.acked_at.append(time.monotonic())
            return

    async def run(self) -> None:
        seq = 0
        while not self.stopped.is_set():
            await asyncio.gather(*(self.send(str(seq + i)) for i in range(self.burst)))
            seq += self.burst
            await asyncio.sleep(self.pause_s)

    def acked_since(self, moment: float) -> int:
        return sum(at >= moment for at in self.acked_at)


@dataclass
class SdkCluster:
    """A nameserver and one broker registered with it."""

    nameserver: ServiceProcess
    broker: BrokerHandle
    http: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.http = httpx.Client(timeout=30.0)

    @property
    def nameservers(self) -> list[str]:
        return [self.nameserver.url]

    def queue_names(self, topic: str) -> set[str]:
        """``str(MessageQueue)`` of every routed queue of ``topic`` (as consumers show them)."""
        route = self.route(topic) or {"queues": []}
        return {f"{topic}@{b['broker_name']}#{q}" for b in route["queues"]
                for q in range(b["queues"])}

    def create_topic(self, queues: int = 4, name: str | None = None) -> str:
        """Create a topic on the broker and wait until the nameserver routes it."""
        topic = self.broker.create_topic(name or unique("T"), queues=queues)
        self.wait_route(topic, queues)
        return topic

    def route(self, topic: str) -> dict[str, Any] | None:
        resp = self.http.get(f"{self.nameserver.url}/v1/routes/{quote(topic, safe='')}")
        return resp.json() if resp.status_code == 200 else None

    def wait_route(self, topic: str, queues: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            route = self.route(topic)
            if route and sum(q["queues"] for q in route["queues"]) == queues:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"nameserver has no route of {queues} queues for {topic}")
            time.sleep(0.02)

    def max_offsets(self, topic: str) -> dict[int, int]:
        """Queue id → max offset (messages ever stored there)."""
        resp = self.broker.http.get(f"/v1/topics/{quote(topic, safe='')}")
        assert resp.status_code == 200, resp.text
        return {o["queue_id"]: o["max"] for o in resp.json()["offsets"]}

    def committed(self, group: str, topic: str) -> dict[int, int]:
        """Queue id → the group's committed offset."""
        resp = self.broker.http.get(f"/v1/groups/{group}/offsets", params={"topic": topic})
        assert resp.status_code == 200, resp.text
        return {o["queue_id"]: o["offset"] for o in resp.json()["offsets"]}

    def pull_all(self, topic: str, queue_id: int = 0) -> list[dict[str, Any]]:
        """Every message of a queue through the REST pull API in JSON."""
        messages: list[dict[str, Any]] = []
        offset = 0
        while True:
            answer = self.broker.pull(quote(topic, safe=""), queue_id, offset, max=1024)
            messages.extend(answer["messages"])
            if answer["next_offset"] >= answer["max_offset"]:
                return messages
            offset = answer["next_offset"]

    def metric(self, name: str) -> float:
        """The sum of every sample of a Prometheus metric of the broker (0 when absent)."""
        text = self.broker.http.get("/metrics").text
        return sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith(name) and line[len(name):len(name) + 1] in (" ", "{"))

    def close(self) -> None:
        self.http.close()


@contextmanager
def run_cluster(workdir: Path, redis_url: str, **broker_settings: Any) -> Iterator[SdkCluster]:
    """A nameserver, then a broker registered with it; ``broker_settings`` as in run_broker."""
    port = free_port()
    nameserver = ServiceProcess("nameserver", port, {
        "TIDEMQ_NAMESRV_PORT": str(port),
        "TIDEMQ_NAMESRV_LOG_LEVEL": "warning",
    }, workdir).start()
    try:
        with run_broker(workdir, redis_url, nameservers=nameserver.url,
                        **broker_settings) as broker:
            cluster = SdkCluster(nameserver, broker)
            try:
                yield cluster
            finally:
                cluster.close()
    finally:
        nameserver.stop()


# --- a push consumer in a child process --------------------------------------------------------

class ConsumerProcess:
    """``python -m tests.system.sdk_harness`` consuming ``topic`` for ``group``.

    The child appends one JSON line per event to ``out``: ``{"ready": client_id}`` once started,
    ``{"assignment": [...]}`` whenever its queues change and ``{"body", "message_id", "at"}``
    per processed message (written before the handler returns SUCCESS).
    """

    def __init__(self, name: str, out: Path, nameservers: list[str], group: str,
                 topic: str) -> None:
        self.name = name
        self.out = out
        self.args = [sys.executable, "-m", "tests.system.sdk_harness",
                     "--nameserver", nameservers[0], "--group", group, "--topic", topic,
                     "--out", str(out), "--name", name]
        self.proc: subprocess.Popen[bytes] | None = None
        self.client_id = ""

    def start(self) -> None:
        self.out.write_text("")
        log = open(self.out.with_suffix(".log"), "ab")  # the child keeps its own descriptor
        with log:
            self.proc = subprocess.Popen(self.args, cwd=REPO, stdout=log, stderr=log)

    def lines(self) -> list[dict[str, Any]]:
        """The complete lines written so far (a line being written is left for later)."""
        text = self.out.read_text() if self.out.exists() else ""
        complete = text[:text.rfind("\n") + 1]
        return [json.loads(line) for line in complete.splitlines()]

    def ready(self) -> bool:
        for line in self.lines():
            if "ready" in line:
                self.client_id = line["ready"]
                return True
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"consumer process {self.name} exited with "
                                 f"{self.proc.returncode}:\n{self.log_text()}")
        return False

    def assignment(self) -> list[str]:
        latest: list[str] = []
        for line in self.lines():
            if "assignment" in line:
                latest = line["assignment"]
        return latest

    def events(self) -> list[Processed]:
        return [Processed(line["body"], line["message_id"], self.name, line["at"])
                for line in self.lines() if "body" in line]

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def log_text(self) -> str:
        path = self.out.with_suffix(".log")
        return path.read_text()[-4000:] if path.exists() else ""


async def _child_main(args: argparse.Namespace) -> None:
    out = open(args.out, "a", buffering=1)  # noqa: ASYNC230 - line-buffered event log

    def write(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj) + "\n")

    async def handle(message: ReceivedMessage) -> ConsumeResult:
        write({"body": message.text, "message_id": message.message_id, "at": time.monotonic()})
        return ConsumeResult.SUCCESS

    consumer = PushConsumer(args.group, handler=handle, nameservers=[args.nameserver],
                            client_id=f"{args.name}-{unique('c')}", **FAST_CONSUMER)
    consumer.subscribe(args.topic)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        await consumer.start()
        write({"ready": consumer.client_id})
        last: list[str] = []
        while not stop.is_set():
            now = [str(q) for q in consumer.assignment]
            if now != last:
                write({"assignment": now})
                last = now
            await asyncio.sleep(0.02)
    finally:
        await consumer.close()
        out.close()


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="a push consumer for SDK tests")
    for name in ("--nameserver", "--group", "--topic", "--out", "--name"):
        parser.add_argument(name, required=True)
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(_child_main(_parse(sys.argv[1:])))
