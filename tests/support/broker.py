"""A real broker process for integration tests (``run_broker``) and a handle to drive it.

Every broker gets its own data dir, a free port and a cluster name of its own, so brokers
sharing the session's redis-server never see each other's consumer state.
"""

from __future__ import annotations

import itertools
import signal
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import msgpack

from tests.support.procs import ServiceProcess, free_port

TOKEN = "test-token"
_names = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_names)}-{uuid.uuid4().hex[:6]}"


class BrokerHandle:
    """A running broker: its process, an HTTP client and a few request helpers."""

    def __init__(self, proc: ServiceProcess, data_dir: Path, env: dict[str, str]) -> None:
        self.proc = proc
        self.data_dir = data_dir
        self.env = env
        self.http = httpx.Client(base_url=proc.url, timeout=40.0)

    @property
    def url(self) -> str:
        return self.proc.url

    def restart(self, sig: int = signal.SIGTERM) -> None:
        self.proc.stop(sig)
        self.proc.start()

    def close(self) -> None:
        self.http.close()
        self.proc.stop()

    # --- helpers ------------------------------------------------------------------------------

    def create_topic(self, name: str | None = None, queues: int = 4, perm: str = "rw") -> str:
        name = name or unique("T")
        resp = self.http.put(f"/v1/topics/{name}", json={"queues": queues, "perm": perm})
        assert resp.status_code == 200, resp.text
        return name

    def send(self, topic: str, *messages: dict[str, Any]) -> list[dict[str, Any]]:
        resp = self.http.post(f"/v1/topics/{topic}/messages", json={"messages": list(messages)})
        assert resp.status_code == 200, resp.text
        results: list[dict[str, Any]] = resp.json()["results"]
        return results

    def pull(self, topic: str, queue_id: int, offset: int = 0, **params: Any) -> dict[str, Any]:
        resp = self.http.get(f"/v1/topics/{topic}/queues/{queue_id}/messages",
                             params={"offset": offset, **params})
        assert resp.status_code == 200, resp.text
        answer: dict[str, Any] = resp.json()
        return answer

    def gauge(self, name: str) -> float:
        """A sample without labels on ``/metrics`` (e.g. ``tidemq_broker_held_pulls``)."""
        for line in self.http.get("/metrics").text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        raise AssertionError(f"no {name} on /metrics")

    def held_pulls(self) -> float:
        """Pulls (and receives) the broker holds now, waiting for a message."""
        return self.gauge("tidemq_broker_held_pulls")

    def pulls_woken(self) -> float:
        """Held pulls woken by a message so far (not by their timeout or a re-read)."""
        return self.gauge("tidemq_broker_held_pulls_woken_total")

    def error(self, resp: httpx.Response, status: int, code: str) -> str:
        assert resp.status_code == status, (resp.status_code, resp.text)
        body = resp.json()
        assert body["code"] == code, body
        assert isinstance(body["message"], str) and body["message"], body
        return str(body["message"])


@contextmanager
def run_broker(workdir: Path, redis_url: str, **settings: Any) -> Iterator[BrokerHandle]:
    """Start ``python -m tidemq_server.broker``; ``settings`` become ``TIDEMQ_BROKER_*``
    variables."""
    port = free_port()
    data_dir = workdir / f"broker-{port}"
    env = {
        "TIDEMQ_BROKER_PORT": str(port),
        "TIDEMQ_BROKER_DATA_DIR": str(data_dir),
        "TIDEMQ_BROKER_REDIS_URL": redis_url,
        "TIDEMQ_BROKER_CLUSTER": unique("cluster"),
        "TIDEMQ_BROKER_TOKEN": TOKEN,
        "TIDEMQ_BROKER_FLUSH_INTERVAL_MS": "50",
        "TIDEMQ_BROKER_SEGMENT_BYTES": str(64 * 1024 * 1024),
        "TIDEMQ_BROKER_LOG_LEVEL": "info",
    }
    env.update({f"TIDEMQ_BROKER_{k.upper()}": str(v) for k, v in settings.items()})
    proc = ServiceProcess("broker", port, env, workdir).start()
    handle = BrokerHandle(proc, data_dir, env)
    try:
        yield handle
    finally:
        handle.close()


def msgpack_post(client: httpx.Client, path: str, obj: Any) -> httpx.Response:
    return client.post(path, content=msgpack.packb(obj, use_bin_type=True),
                       headers={"content-type": "application/msgpack",
                                "accept": "application/msgpack"})

