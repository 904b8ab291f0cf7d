"""A broker and a scheduler as real processes, wired to each other, with helpers for delays.

``run_delay_cluster`` starts the broker (``scheduler_url`` set, a short delay table when asked)
and then the scheduler, both on the session's redis-server with a cluster name of their own.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.support.broker import TOKEN, BrokerHandle, run_broker, unique
from tests.support.procs import ServiceProcess, free_port
from tests.support.wait import wait_until

AUTH = {"X-Tidemq-Token": TOKEN}
FAST_SCHEDULER = {"tick_ms": "50", "level_poll_ms": "50", "checkpoint_interval_ms": "200",
                  "progress_interval_ms": "200", "intake_wait_ms": "500", "roll_interval_ms": "200"}

__all__ = ["AUTH", "DelayCluster", "run_delay_cluster", "unique", "wait_until"]




class DelayCluster:
    def __init__(self, broker: BrokerHandle, scheduler: ServiceProcess) -> None:
        self.broker = broker
        self.scheduler = scheduler
        self.sched = httpx.Client(base_url=scheduler.url, headers=AUTH, timeout=30.0)

    @property
    def http(self) -> httpx.Client:
        return self.broker.http

    def close(self) -> None:
        self.sched.close()
        self.scheduler.stop()

    def restart_scheduler(self, sig: int = signal.SIGTERM) -> None:
        self.scheduler.stop(sig)
        self.scheduler.start()
        self.wait_ready()

    def wait_ready(self) -> None:
        wait_until(lambda: self.status()["ready"], 20, "the scheduler to connect")

    def status(self) -> dict[str, Any]:
        answer: dict[str, Any] = self.sched.get("/internal/v1/status").json()
        return answer

    def advance_clock(self, ms: int) -> int:
        resp = self.sched.post("/internal/v1/clock", json={"advance_ms": ms})
        assert resp.status_code == 200, resp.text
        return int(resp.json()["now_ms"])

    def scheduled(self, topic: str | None = None) -> dict[str, Any]:
        resp = self.http.get("/v1/scheduled", params={"topic": topic} if topic else {})
        assert resp.status_code == 200, resp.text
        answer: dict[str, Any] = resp.json()
        return answer

    def cancel(self, message_id: str, topic: str | None = None) -> httpx.Response:
        return self.http.delete(f"/v1/messages/{message_id}/schedule",
                                params={"topic": topic} if topic else {})

    def state(self, message_id: str) -> str:
        resp = self.http.get(f"/v1/messages/{message_id}")
        assert resp.status_code == 200, resp.text
        return str(resp.json()["state"])

    def pull_all(self, topic: str) -> list[dict[str, Any]]:
        """Every message of every queue of ``topic`` (from offset 0)."""
        queues = self.http.get(f"/v1/topics/{topic}").json()["queues"]
        out: list[dict[str, Any]] = []
        for qid in range(queues):
            offset = 0
            while True:
                answer = self.broker.pull(topic, qid, offset, max=1024)
                out += answer["messages"]
                if answer["next_offset"] >= answer["max_offset"]:
                    break
                offset = answer["next_offset"]
        return out


@contextmanager
def run_delay_cluster(workdir: Path, redis_url: str, *, levels: str | None = None,
                      scheduler: dict[str, str] | None = None,
                      **broker_settings: Any) -> Iterator[DelayCluster]:
    """Start a broker and its scheduler; ``scheduler`` holds ``TIDEMQ_SCHEDULER_*`` values."""
    sport = free_port()
    settings: dict[str, Any] = {"scheduler_url": f"http://127.0.0.1:{sport}", **broker_settings}
    if levels:
        settings["delay_levels"] = levels
    with run_broker(workdir, redis_url, **settings) as broker:
        env = {
            "TIDEMQ_SCHEDULER_PORT": str(sport),
            "TIDEMQ_SCHEDULER_BROKER_URL": broker.url,
            "TIDEMQ_SCHEDULER_REDIS_URL": redis_url,
            "TIDEMQ_SCHEDULER_TOKEN": TOKEN,
            "TIDEMQ_SCHEDULER_CLUSTER": broker.env["TIDEMQ_BROKER_CLUSTER"],
            "TIDEMQ_SCHEDULER_DATA_DIR": str(workdir / f"scheduler-{sport}"),
            "TIDEMQ_SCHEDULER_LOG_LEVEL": "info",
        }
        env.update({f"TIDEMQ_SCHEDULER_{k.upper()}": v
                    for k, v in {**FAST_SCHEDULER, **(scheduler or {})}.items()})
        proc = ServiceProcess("scheduler", sport, env, workdir).start()
        cluster = DelayCluster(broker, proc)
        try:
            cluster.wait_ready()
            yield cluster
        finally:
            cluster.close()
