"""Real processes for the transaction tests: a broker, a checker, producers in their own process.

The ``cluster`` fixture starts a broker and a checker with short intervals (the checker scans
every ``INTERVAL_MS``, first checks after ``IMMUNITY_MS``) on the session's redis-server and
shares them with a module; a directory's conftest.py imports it to use it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.broker import TOKEN, BrokerHandle, run_broker, unique
from tests.support.procs import REPO, RedisServer, ServiceProcess, free_port

INTERVAL_MS = 300
IMMUNITY_MS = 400


class CheckerHandle:
    def __init__(self, proc: ServiceProcess) -> None:
        self.proc = proc
        self.http = httpx.Client(base_url=proc.url, timeout=30.0)

    def scan(self) -> dict[str, Any]:
        resp = self.http.post("/internal/v1/scan", headers={"X-Tidemq-Token": TOKEN})
        assert resp.status_code == 200, resp.text
        report: dict[str, Any] = resp.json()
        return report

    def metrics(self) -> str:
        return self.http.get("/metrics").text

    def close(self) -> None:
        self.http.close()
        self.proc.stop()


def checker_process(workdir: Path, broker: BrokerHandle, redis_url: str,
                    **settings: Any) -> ServiceProcess:
    port = free_port()
    env = {
        "TIDEMQ_CHECKER_PORT": str(port),
        "TIDEMQ_CHECKER_BROKER_URL": broker.url,
        "TIDEMQ_CHECKER_REDIS_URL": redis_url,
        "TIDEMQ_CHECKER_TOKEN": TOKEN,
        "TIDEMQ_CHECKER_CLUSTER": broker.env["TIDEMQ_BROKER_CLUSTER"],
        "TIDEMQ_CHECKER_CHECK_INTERVAL_MS": str(INTERVAL_MS),
        "TIDEMQ_CHECKER_TRANSACTION_TIMEOUT_MS": str(IMMUNITY_MS),
    }
    env.update({f"TIDEMQ_CHECKER_{k.upper()}": str(v) for k, v in settings.items()})
    return ServiceProcess("checker", port, env, workdir)


@contextmanager
def run_checker(workdir: Path, broker: BrokerHandle, redis_url: str,
                **settings: Any) -> Iterator[CheckerHandle]:
    handle = CheckerHandle(checker_process(workdir, broker, redis_url, **settings).start())
    try:
        yield handle
    finally:
        handle.close()


class Producer:
    """``tests/support/producer_proc.py`` in its own process; JSON lines on stdout."""

    def __init__(self, broker: BrokerHandle, group: str, workdir: Path, *args: str) -> None:
        self.out_path = workdir / f"producer-{unique('p')}.out"
        self.err_path = self.out_path.with_suffix(".err")
        cmd = [sys.executable, str(Path(__file__).with_name("producer_proc.py")),
               "--broker", broker.url, "--group", group, *args]
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=err,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def lines(self) -> list[dict[str, Any]]:
        text = self.out_path.read_text() if self.out_path.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def wait_for(self, predicate: Callable[[list[dict[str, Any]]], bool],
                 timeout: float = 30.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            lines = self.lines()
            if predicate(lines):
                return lines
            assert self.proc.poll() is None or predicate(self.lines()), self.stderr()
            assert time.monotonic() < deadline, f"timed out; stdout: {lines}\n{self.stderr()}"
            time.sleep(0.05)

    def stderr(self) -> str:
        return self.err_path.read_text()[-4000:] if self.err_path.exists() else ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 30.0) -> int:
        """Wait for the producer to finish on its own (its sends, then ``--serve``)."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.proc.returncode


def sent_of(p: Producer) -> list[dict[str, Any]]:
    """What a producer process reported sending, once it says it is done."""
    return [x["sent"] for x in p.wait_for(lambda ls: any(x.get("done") for x in ls))
            if "sent" in x]


def delivered(broker: BrokerHandle, topic: str, queues: int) -> list[dict[str, Any]]:
    """Every message in every queue of ``topic``."""
    out: list[dict[str, Any]] = []
    for q in range(queues):
        out.extend(broker.pull(topic, q, max=1024)["messages"])
    return out


def state_of(broker: BrokerHandle, message_id: str) -> str:
    resp = broker.http.get(f"/v1/messages/{message_id}")
    assert resp.status_code == 200, resp.text
    return str(resp.json()["state"])


def pending(broker: BrokerHandle, group: str) -> list[dict[str, Any]]:
    resp = broker.http.get("/v1/transactions", params={"producer_group": group,
                                                        "state": "pending"})
    assert resp.status_code == 200, resp.text
    found: list[dict[str, Any]] = resp.json()["transactions"]
    return found


def events(broker: BrokerHandle) -> list[dict[str, Any]]:
    answer = broker.pull("TIDE_SYS_TRANS_EVENTS", 0, max=1024)
    return [json.loads(m["body"]) for m in answer["messages"]]


@dataclass
class Cluster:
    broker: BrokerHandle
    checker: CheckerHandle
    workdir: Path
    redis_url: str


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory,
            redis_server: RedisServer) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("tx")
    with run_broker(workdir, redis_server.url, producer_expiry_s=30) as broker, \
            run_checker(workdir, broker, redis_server.url) as checker:
        yield Cluster(broker, checker, workdir, redis_server.url)


__all__ = ["INTERVAL_MS", "TOKEN", "BrokerHandle", "CheckerHandle", "Cluster", "Producer",
           "cluster", "delivered", "events", "pending", "run_broker", "run_checker", "sent_of",
           "state_of", "unique"]
