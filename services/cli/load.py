"""`tidemq bench --topic T`: load the running cluster, every broker group of the topic's route.

The route comes from the nameservers (``GET /v1/routes/{topic}``, the first that answers), as
clients see it; batches of ``batch`` messages go to the writable groups in turn, ``workers``
requests in flight at once, and each group's count and send rate are reported beside the
total. (The suite under ``bench/``, which `tidemq bench` runs without ``--topic``, starts its
own processes and never touches a running cluster.)
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from tidemq_server.cli.rest import CliError, Endpoints, answer, call, segment, unreachable

MAX_WORKERS = 32  # requests in flight at most


@dataclass
class GroupLoad:
    broker_name: str
    address: str
    sent: int = 0
    seconds: float = 0.0  # summed request time


@dataclass
class LoadReport:
    topic: str
    groups: list[GroupLoad]
    elapsed_s: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def sent(self) -> int:
        return sum(g.sent for g in self.groups)

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "sent": self.sent, "elapsed_s": round(self.elapsed_s, 3),
                "msg_per_s": round(self.sent / max(self.elapsed_s, 1e-9)),
                "groups": [{"broker_name": g.broker_name, "address": g.address, "sent": g.sent}
                           for g in self.groups],
                "failures": self.failures}


def writable_groups(client: httpx.Client, ep: Endpoints, topic: str) -> list[GroupLoad]:
    """The groups that take sends to ``topic``, from the first nameserver that answers."""
    errors: list[str] = []
    for url in ep.nameserver_urls():
        try:
            route = answer(client.get(f"{url}/v1/routes/{segment(topic)}"))
        except httpx.HTTPError as exc:
            errors.append(unreachable(url, exc).message)
            continue
        groups = [GroupLoad(str(q["broker_name"]), str(q["address"]))
                  for q in route.get("queues", []) if "w" in str(q.get("perm", "rw"))]
        if not groups:
            raise CliError(f"BAD_REQUEST: no broker group takes sends to {topic} (perm r)")
        return groups
    raise CliError("; ".join(errors))


def run_load(client: httpx.Client, groups: list[GroupLoad], topic: str, count: int,
             batch: int, body_bytes: int, workers: int,
             progress: Callable[[int], None]) -> LoadReport:
    """Send ``count`` messages of ``body_bytes`` to ``groups`` in turn; a failed request is
    recorded (its messages not counted) and the load goes on."""
    report = LoadReport(topic, groups)
    body = "x" * body_bytes
    turn = itertools.cycle(groups)
    lock = threading.Lock()
    sizes = [min(batch, count - first) for first in range(0, count, batch)]

    def one(size: int) -> None:
        with lock:
            group = next(turn)
        began = time.perf_counter()
        try:
            call(client, "POST", f"{group.address}/v1/topics/{segment(topic)}/messages",
                 json={"messages": [{"body": body}] * size})
        except CliError as exc:
            with lock:
                report.failures.append(f"{group.broker_name}: {exc.message}")
            return
        with lock:
            group.sent += size
            group.seconds += time.perf_counter() - began
        progress(size)

    began = time.perf_counter()
    with ThreadPoolExecutor(max(1, min(workers, MAX_WORKERS))) as pool:
        list(pool.map(one, sizes))
    report.elapsed_s = time.perf_counter() - began
    return report
