"""`tidemq up --replicas N` for real: one group of brokers on predictable ports, the replicas
registered as such and following the primary; every member serves a gRPC door, and routes name
the current primary's, also after a failover."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import psutil
import pytest

from tests.support.broker import unique
from tests.support.up import UpRun, free_base, port_free
from tests.support.wait import wait_until
from tidemq_server.broker.grpc.proto import Code, MessageType, pb, service_grpc, service_pb

pytestmark = pytest.mark.integration


def test_up_runs_a_primary_and_two_replicas(tmp_path: Path) -> None:
    ns, checker, scheduler = free_base(1, 1), free_base(1, 1), free_base(1, 1)
    broker = free_base(3, 100)
    up = UpRun(tmp_path, "--replicas", "3", "--nameserver-port", str(ns),
               "--broker-port", str(broker), "--checker-port", str(checker),
               "--scheduler-port", str(scheduler), "--grpc-port", "0", "--no-metrics",
               "--skip", "console", "--stop-timeout", "20")
    try:
        up.wait_ready(150)
        urls = [f"http://127.0.0.1:{broker + 100 * j}" for j in range(3)]
        for name in ("broker-r1", "broker-r2", urls[1], urls[2]):
            assert name in up.output()
        view = httpx.get(f"http://127.0.0.1:{ns}/v1/cluster", timeout=5).json()
        members = {b["address"]: (b["broker_name"], b["role"], b["broker_id"])
                   for b in view["brokers"]}
        assert members == {urls[0]: ("broker-a", "primary", 0),
                           urls[1]: ("broker-a", "replica", 1),
                           urls[2]: ("broker-a", "replica", 2)}
        topic = unique("Up")
        assert httpx.put(f"{urls[0]}/v1/topics/{topic}", json={"queues": 1}).status_code == 200
        sent = httpx.post(f"{urls[0]}/v1/topics/{topic}/messages", timeout=10,
                          json={"messages": [{"body": "copied"}]})
        assert sent.status_code == 200, sent.text
        for url in urls[1:]:
            for _ in range(100):
                resp = httpx.get(f"{url}/v1/topics/{topic}/queues/0/messages", timeout=5)
                if resp.status_code == 200 and resp.json()["messages"]:
                    break
                time.sleep(0.1)
            assert [m["body"] for m in resp.json()["messages"]] == ["copied"]
        assert up.stop() == 0, up.output()
    finally:
        up.kill()


def _free_pair() -> int:
    """A port whose successor is free too (etcd's client and peer ports)."""
    while True:
        port = free_base(2, 1)
        if port_free(port + 1):
            return port


async def _route(endpoint: str, topic: str) -> list[tuple[str, int]]:
    """The gRPC endpoints a door's QueryRoute names for ``topic`` (one per queue); asked
    again while the door's cached cluster view (GRPC_ROUTE_CACHE_S) predates the topic."""
    async with grpc.aio.insecure_channel(endpoint) as channel:
        stub = service_grpc.MessagingServiceStub(channel)
        request = service_pb.QueryRouteRequest()
        request.topic.name = topic
        deadline = time.monotonic() + 15
        while True:
            answer = await stub.QueryRoute(request, timeout=10)
            if answer.status.code != Code.TOPIC_NOT_FOUND or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.3)
    assert answer.status.code == Code.OK, answer.status
    return [(a.host, a.port) for q in answer.message_queues
            for a in q.broker.endpoints.addresses]


async def _grpc_send(endpoint: str, topic: str, message_id: str) -> tuple[int, str]:
    async with grpc.aio.insecure_channel(endpoint) as channel:
        stub = service_grpc.MessagingServiceStub(channel)
        msg = pb.Message(body=b"after the failover")
        msg.topic.name = topic
        msg.system_properties.message_id = message_id
        msg.system_properties.message_type = MessageType.Value("NORMAL")
        answer = await stub.SendMessage(service_pb.SendMessageRequest(messages=[msg]),
                                        metadata=(("x-mq-client-id", "up-test"),), timeout=10)
    return int(answer.status.code), str(answer.status.message)


def test_every_member_serves_grpc_and_routes_name_the_current_primary(tmp_path: Path) -> None:
    """Also what a fresh `up` prints and answers, with its output in a file (not a terminal)
    and no COLUMNS, as under a supervisor or a pipe (one `up` run for both, to save time): the
    endpoint table names every service in full (two nameservers were both "nameserver…"), and
    its nameservers answer 404 for an unknown topic once its brokers registered, with the
    default 30 s warm-up left on (they were 503 for the whole warm-up)."""
    ns, checker, scheduler = free_base(2, 1), free_base(1, 1), free_base(1, 1)
    broker, grpc_base = free_base(2, 100), free_base(2, 100)
    up = UpRun(tmp_path, "--replicas", "2", "--nameservers", "2", "--nameserver-port", str(ns),
               "--broker-port", str(broker), "--checker-port", str(checker),
               "--scheduler-port", str(scheduler), "--grpc-port", str(grpc_base),
               "--etcd-port", str(_free_pair()), "--no-metrics", "--skip", "console",
               "--stop-timeout", "20",
               env={"TIDEMQ_BROKER_MIN_INSYNC": "1",  # the promoted copy writes alone
                    "COLUMNS": "", "TIDEMQ_NAMESRV_WARMUP_S": "30"})
    frozen: psutil.Process | None = None
    try:
        up.wait_ready(150)
        out = up.output()
        table = out[out.index("tidemq is up"):]
        assert "…" not in table, table
        for name, port in (("nameserver-1", ns), ("nameserver-2", ns + 1)):
            assert name in next(ln for ln in table.splitlines() if f":{port}" in ln), table
            resp = httpx.get(f"http://127.0.0.1:{port}/v1/routes/NoSuchTopic", timeout=5)
            assert resp.status_code == 404 and resp.json()["code"] == "TOPIC_NOT_FOUND", resp.text
        primary_door, replica_door = f"127.0.0.1:{grpc_base}", f"127.0.0.1:{grpc_base + 100}"
        view = httpx.get(f"http://127.0.0.1:{ns}/v1/cluster", timeout=5).json()
        doors = {b["broker_id"]: (b["role"], b["grpc_address"]) for b in view["brokers"]}
        assert doors == {0: ("primary", primary_door), 1: ("replica", replica_door)}, doors
        topic = unique("Grpc")
        resp = httpx.put(f"http://127.0.0.1:{broker}/v1/topics/{topic}", json={"queues": 2})
        assert resp.status_code == 200, resp.text
        at_replica = asyncio.run(_route(replica_door, topic))
        assert set(at_replica) == {("127.0.0.1", grpc_base)}  # the primary's door
        sent = httpx.post(f"http://127.0.0.1:{broker}/v1/topics/{topic}/messages", timeout=10,
                          json={"messages": [{"body": "before", "queue_id": 0}]})
        assert sent.status_code == 200, sent.text
        replica = f"http://127.0.0.1:{broker + 100}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the replica holds the topic and its message
            resp = httpx.get(f"{replica}/v1/topics/{topic}/queues/0/messages", timeout=5)
            if resp.status_code == 200 and resp.json()["messages"]:
                break
            time.sleep(0.2)
        assert resp.status_code == 200 and resp.json()["messages"], resp.text

        # failover: freeze the primary (the supervisor sees it alive); its lease lapses
        frozen = next(p for p in psutil.Process(up.proc.pid).children()
                      if p.environ().get("TIDEMQ_BROKER_PORT") == str(broker))
        frozen.suspend()

        def promoted() -> list[dict[str, Any]]:
            view = httpx.get(f"http://127.0.0.1:{ns}/v1/cluster", timeout=5).json()
            return [b for b in view["brokers"] if b["role"] == "primary"
                    and b["grpc_address"] == replica_door]

        wait_until(promoted, timeout=60, every=0.5, what="the replica promoted")
        assert set(asyncio.run(_route(replica_door, topic))) == {("127.0.0.1",
                                                                   grpc_base + 100)}
        code, message = asyncio.run(_grpc_send(replica_door, topic, unique("m")))
        assert code == Code.OK, message
    finally:
        if frozen is not None:
            frozen.resume()
        up.kill()
