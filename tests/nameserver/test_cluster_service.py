"""Two nameservers and real brokers: every broker registers with both, `GET /v1/cluster` shows
the cluster fields and the nameserver list, a clean stop leaves both at once, a killed broker
leaves within the expiry, and malformed cluster fields are refused."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.broker import TOKEN, run_broker, unique
from tests.support.procs import RedisServer, ServiceProcess, free_port
from tests.support.wait import TIMEOUT_S, wait_until
from tidemq_server.common.constants import BROKER_EXPIRY_S, TOKEN_HEADER

pytestmark = pytest.mark.integration

EXPIRY_S = 3.0  # broker expiry of these nameservers
AUTH = {TOKEN_HEADER: TOKEN}


@pytest.fixture(scope="module")
def nameservers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServiceProcess]]:
    ports = [free_port(), free_port()]
    peers = ",".join(f"http://127.0.0.1:{p}" for p in ports)
    procs = []
    for port in ports:
        env = {"TIDEMQ_NAMESRV_PORT": str(port), "TIDEMQ_NAMESRV_TOKEN": TOKEN,
               "TIDEMQ_NAMESRV_PEERS": peers,
               "TIDEMQ_NAMESRV_BROKER_EXPIRY_S": str(EXPIRY_S),
               "TIDEMQ_NAMESRV_EXPIRY_CHECK_INTERVAL_S": "0.2"}
        procs.append(ServiceProcess("nameserver", port, env,
                                    tmp_path_factory.mktemp("ns-cluster")).start())
    yield procs
    for proc in procs:
        proc.stop()


def members(url: str, name: str) -> list[dict[str, Any]]:
    brokers = httpx.get(f"{url}/v1/cluster", timeout=5).json()["brokers"]
    return [b for b in brokers if b["broker_name"] == name]


def test_cluster_view_lists_the_nameservers(nameservers: list[ServiceProcess]) -> None:
    urls = [ns.url for ns in nameservers]
    for url in urls:
        assert httpx.get(f"{url}/v1/cluster", timeout=5).json()["nameservers"] == urls


def test_broker_registers_with_every_nameserver_and_leaves_cleanly(
        nameservers: list[ServiceProcess], redis_server: RedisServer, tmp_path: Path) -> None:
    urls = [ns.url for ns in nameservers]
    name, grpc_port = unique("grp"), free_port()
    with run_broker(tmp_path, redis_server.url, nameservers=",".join(urls), broker_name=name,
                    grpc_port=grpc_port, register_interval_s=0.2,
                    internal_address="http://broker-internal:10911/") as broker:
        topic = broker.create_topic(queues=3)
        for url in urls:  # registered at creation with both
            [queue] = httpx.get(f"{url}/v1/routes/{topic}", timeout=5).json()["queues"]
            assert queue == {"broker_name": name, "address": broker.url, "queues": 3,
                             "perm": "rw", "replicas": []}
            [member] = members(url, name)
            assert {k: member[k] for k in ("broker_id", "role", "epoch", "address",
                                           "internal_address", "grpc_address")} == {
                "broker_id": 0, "role": "primary", "epoch": 0, "address": broker.url,
                "internal_address": "http://broker-internal:10911",
                "grpc_address": f"127.0.0.1:{grpc_port}"}
        before = members(urls[0], name)[0]["max_offset"]
        broker.send(topic, {"body": "x" * 100})
        # the next heartbeats carry the commit log's new end
        for url in urls:
            def grown(u: str = url) -> bool:
                return int(members(u, name)[0]["max_offset"]) > before
            wait_until(grown, what="max_offset to grow")
    # the clean stop said goodbye to both: gone at once, not after the expiry
    for url in urls:
        assert members(url, name) == []
        assert httpx.get(f"{url}/v1/routes/{topic}", timeout=5).status_code == 404


def test_killed_broker_leaves_within_the_expiry(
        nameservers: list[ServiceProcess], redis_server: RedisServer, tmp_path: Path) -> None:
    urls = [ns.url for ns in nameservers]
    name = unique("grp")
    with run_broker(tmp_path, redis_server.url, nameservers=",".join(urls), broker_name=name,
                    register_interval_s=0.5) as broker:
        broker.create_topic(queues=1)
        assert all(members(url, name) for url in urls)
        broker.proc.stop(signal.SIGKILL)  # no goodbye
        # dropped by this expiry (3 s), within a wait far below the default one (120 s)
        assert TIMEOUT_S < BROKER_EXPIRY_S
        wait_until(lambda: not any(members(u, name) for u in urls), what="the expiry")


@pytest.mark.parametrize(("extra", "field"), [
    ({"broker_id": -1}, "broker_id"),
    ({"broker_id": "0"}, "broker_id"),
    ({"role": "leader"}, "role"),
    ({"epoch": -2}, "epoch"),
    ({"grpc_address": "http://x:1"}, "grpc_address"),
    ({"internal_address": "broker-a:10911"}, "internal_address"),
    ({"max_offset": 1.5}, "max_offset"),
])
def test_malformed_cluster_fields_are_400(nameservers: list[ServiceProcess],
                                          extra: dict[str, Any], field: str) -> None:
    body = {"cluster": "c", "broker_name": "bad", "address": "http://127.0.0.1:1",
            "topics": {}, **extra}
    resp = httpx.post(f"{nameservers[0].url}/v1/brokers/heartbeat", json=body, headers=AUTH,
                      timeout=5)
    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "BAD_REQUEST" and field in resp.json()["message"]


def test_goodbye_names_the_member(nameservers: list[ServiceProcess]) -> None:
    url = nameservers[1].url
    name = unique("grp")
    for broker_id, role in ((0, "primary"), (1, "replica")):
        body = {"cluster": "c", "broker_name": name, "broker_id": broker_id, "role": role,
                "address": f"http://127.0.0.1:{20000 + broker_id}",
                "topics": {"member-topic": {"queues": 2, "perm": "rw"}}}
        httpx.post(f"{url}/v1/brokers/heartbeat", json=body, headers=AUTH,
                   timeout=5).raise_for_status()
    route = httpx.get(f"{url}/v1/routes/member-topic", timeout=5).json()["queues"]
    assert [(q["broker_name"], q["replicas"]) for q in route] == [
        (name, ["http://127.0.0.1:20001"])]

    gone = httpx.delete(f"{url}/v1/brokers/{name}", headers=AUTH, timeout=5,
                        params={"broker_id": 1, "address": "http://127.0.0.1:20001"})
    assert gone.status_code == 200, gone.text
    assert [m["broker_id"] for m in members(url, name)] == [0]
    again = httpx.delete(f"{url}/v1/brokers/{name}", headers=AUTH, timeout=5,
                         params={"broker_id": 1})
    assert again.status_code == 404 and "(id 1)" in again.json()["message"]
    bad = httpx.delete(f"{url}/v1/brokers/{name}", headers=AUTH, timeout=5,
                       params={"broker_id": "x"})
    assert bad.status_code == 400 and bad.json()["code"] == "BAD_REQUEST"
