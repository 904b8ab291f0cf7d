"""`tidemq up` supervises: SIGKILL each service in turn (nameserver, broker, checker, scheduler,
metrics sidecar without its Spark job, Redis); each is restarted with a line saying so, the
others keep their process, and the system keeps serving (a send and a pull through REST, and
consumer offsets in Redis) after every kill."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import psutil
import pytest

from tests.support.procs import free_port
from tests.support.up import UpRun
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration

KILLED_IN_TURN = ("nameserver", "broker", "checker", "scheduler", "metrics", "console", "redis")
TOPIC = "supervised"
GROUP = "supervised-readers"


def send_and_pull(broker: httpx.Client, body: str) -> None:
    sent = broker.post(f"/v1/topics/{TOPIC}/messages",
                       json={"messages": [{"body": body, "queue_id": 0}]})
    assert sent.status_code == 200, sent.text
    offset = sent.json()["results"][0]["queue_offset"]
    pulled = broker.get(f"/v1/topics/{TOPIC}/queues/0/messages", params={"offset": offset})
    assert pulled.status_code == 200, pulled.text
    assert [m["body"] for m in pulled.json()["messages"]] == [body]


def commit_offset(broker: httpx.Client, offset: int) -> None:
    resp = broker.put(f"/v1/groups/{GROUP}/offsets",
                      json={"offsets": [{"topic": TOPIC, "queue_id": 0, "offset": offset}]})
    assert resp.status_code == 200, resp.text


def aof_bytes(redis: psutil.Process) -> bytes:
    """The append-only files of the managed redis-server, as one byte string (Redis works in
    its --dir: its working directory)."""
    folder = Path(redis.cwd())
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*.aof")))


def committed(broker: httpx.Client) -> int:
    rows = broker.get(f"/v1/groups/{GROUP}/offsets", params={"topic": TOPIC}).json()["offsets"]
    return int(next(r["offset"] for r in rows if r["queue_id"] == 0))


def test_each_killed_service_is_restarted_and_the_system_keeps_serving(tmp_path: Path) -> None:
    ports = {name: free_port() for name in ("nameserver", "broker", "checker", "scheduler",
                                            "metrics")}
    up = UpRun(tmp_path, *(arg for name, port in ports.items()
                           for arg in (f"--{name}-port", str(port))),
               "--grpc-port", "0", "--stop-timeout", "20",
               env={"TIDEMQ_METRICS_RUN_JOB": "false"})  # the sidecar's HTTP side, no Spark
    try:
        up.wait_ready()
        broker = httpx.Client(base_url=f"http://127.0.0.1:{ports['broker']}", timeout=10)
        assert broker.put(f"/v1/topics/{TOPIC}", json={"queues": 1}).status_code == 200
        send_and_pull(broker, "before any kill")
        before = up.children()
        assert set(before) == set(KILLED_IN_TURN), before

        for round_no, name in enumerate(KILLED_IN_TURN, start=1):
            if name == "redis":
                redis = up.children()["redis"]
                written = len(aof_bytes(redis))
                commit_offset(broker, round_no)
                # the commit is in the AOF (in the file, which a SIGKILL of Redis keeps) first
                wait_until(lambda r=redis, w=written: GROUP.encode() in aof_bytes(r)[w:],
                           what="the offset commit in Redis's AOF")
            victim = up.children()[name]
            victim.kill()
            up.wait_for(f"{name} exited by SIGKILL; restarted (1st time)", 30)
            up.wait_for(f"{name} ready again", 60)
            now = up.children()
            assert now[name].pid != victim.pid
            for other in set(KILLED_IN_TURN) - {name}:  # nobody else was restarted
                assert now[other].pid == before[other].pid, (other, up.output())
            before[name] = now[name]
            port = ports.get(name)
            if port:
                health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
                assert health.status_code == 200, health.text
            send_and_pull(broker, f"after killing {name} {uuid.uuid4().hex[:6]}")
        # Redis came back with its data, and takes writes again
        assert committed(broker) == len(KILLED_IN_TURN)
        commit_offset(broker, len(KILLED_IN_TURN) + 1)  # every message sent, read
        assert committed(broker) == len(KILLED_IN_TURN) + 1
        assert up.proc.poll() is None
        assert up.stop() == 0, up.output()
    finally:
        up.kill()
    output = up.output()
    assert "restarted (2nd time)" not in output
    for name in KILLED_IN_TURN:
        assert f"stopped {name} cleanly" in output, output
