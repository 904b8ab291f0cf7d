"""A replicated broker group of real processes: a primary (broker_id 0) and its replicas."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import msgpack

from tests.support.broker import BrokerHandle, run_broker, unique
from tests.support.wait import wait_until

#: Short intervals so that the tests run fast.
FAST = {"replica_lag_max_ms": 1500, "replica_fetch_wait_ms": 200, "replica_retry_ms": 100,
        "sync_ack_timeout_ms": 2000, "grpc_port": 0}


@contextmanager
def run_group(workdir: Path, redis_url: str, copies: int = 3, **settings: Any
              ) -> Iterator[list[BrokerHandle]]:
    """Start a primary and ``copies - 1`` replicas following it; yields [primary, *replicas].
    ``settings`` (TIDEMQ_BROKER_* without the prefix) go to every member."""
    common = {**FAST, "replicas": copies, "cluster": unique("cluster"),
              "broker_name": unique("group"), **settings}
    with ExitStack() as stack:
        primary = stack.enter_context(run_broker(workdir, redis_url, broker_id=0, **common))
        members = [primary]
        for i in range(1, copies):
            members.append(stack.enter_context(run_broker(
                workdir, redis_url, broker_id=i, primary_address=primary.url, **common)))
        yield members


def send_raw(broker: BrokerHandle, topic: str, *messages: dict[str, Any]) -> Any:
    return broker.http.post(f"/v1/topics/{topic}/messages", json={"messages": list(messages)})


def bodies(broker: BrokerHandle, topic: str, queue_id: int = 0) -> list[str]:
    answer = broker.pull(topic, queue_id, 0, max=1024)
    return [m["body"] for m in answer["messages"]]


def status(broker: BrokerHandle) -> dict[str, Any]:
    resp = broker.http.get("/internal/v1/replication/status",
                           headers={"x-tidemq-token": broker.env["TIDEMQ_BROKER_TOKEN"]})
    assert resp.status_code == 200, resp.text
    answer: dict[str, Any] = resp.json()
    return answer


def wait_in_sync(primary: BrokerHandle, copies: int, timeout: float = 15.0) -> None:
    wait_until(lambda: status(primary)["in_sync_copies"] >= copies, timeout,
               f"{copies} in-sync copies")


def read_log(broker: BrokerHandle) -> list[tuple[int, bytes]]:
    """The whole commit log of ``broker`` as ``(offset, bytes)`` chunks, through its API."""
    headers = {"x-tidemq-token": broker.env["TIDEMQ_BROKER_TOKEN"],
               "accept": "application/msgpack"}
    out: list[tuple[int, bytes]] = []
    offset = None
    while True:
        params = {"from": offset if offset is not None else 0, "max_bytes": 1 << 20}
        resp = broker.http.get("/internal/v1/replication/log", params=params, headers=headers)
        if resp.status_code == 400 and offset is None:  # the log no longer starts at 0
            offset = status(broker)["min_offset"]
            continue
        assert resp.status_code == 200, resp.text
        body = msgpack.unpackb(resp.content, raw=False)
        start = params["from"]
        if body["data"]:
            out.append((start, body["data"]))
        if body["next"] >= body["log_end"]:
            return out
        offset = body["next"]


def set_role(broker: BrokerHandle, role: str, epoch: int, primary_address: str = ""
             ) -> dict[str, Any]:
    resp = broker.http.post("/internal/v1/replication/role",
                            json={"role": role, "epoch": epoch,
                                  "primary_address": primary_address},
                            headers={"x-tidemq-token": broker.env["TIDEMQ_BROKER_TOKEN"]})
    assert resp.status_code == 200, resp.text
    answer: dict[str, Any] = resp.json()
    return answer


@contextmanager
def paused(member: BrokerHandle) -> Iterator[None]:
    """``member``'s process stopped (SIGSTOP) for the block, then continued: it answers nothing
    and fetches nothing meanwhile, yet keeps its state (a long GC, a stalled VM)."""
    proc = member.proc.proc
    assert proc is not None, "the member is not running"
    proc.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        proc.send_signal(signal.SIGCONT)


def hand_over(old: BrokerHandle, new: BrokerHandle, epoch: int) -> None:
    """A failover by hand: ``old`` follows ``new`` under ``epoch``, then ``new`` leads."""
    set_role(old, "replica", epoch, new.url)
    assert set_role(new, "primary", epoch)["role"] == "primary"
