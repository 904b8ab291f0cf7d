"""Broker registration takes the cluster token: a nameserver and a broker as real processes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.broker import TOKEN, run_broker
from tests.support.procs import RedisServer, ServiceProcess, free_port
from tidemq_server.common.constants import TOKEN_HEADER

pytestmark = pytest.mark.integration

AUTH = {TOKEN_HEADER: TOKEN}


@pytest.fixture(scope="module")
def nameserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    port = free_port()
    env = {"TIDEMQ_NAMESRV_PORT": str(port), "TIDEMQ_NAMESRV_TOKEN": TOKEN}
    proc = ServiceProcess("nameserver", port, env, tmp_path_factory.mktemp("ns-auth")).start()
    yield proc
    proc.stop()


@pytest.fixture
def client(nameserver: ServiceProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=nameserver.url, timeout=5.0) as c:
        yield c


def heartbeat(name: str, topic: str) -> dict[str, Any]:
    return {"cluster": "auth", "broker_name": name, "address": "http://127.0.0.1:10999",
            "topics": {topic: {"queues": 2, "perm": "rw"}}}


def assert_error(resp: httpx.Response, status: int, code: str) -> None:
    assert resp.status_code == status, resp.text
    assert resp.json()["code"] == code, resp.text


def test_heartbeat_needs_the_token(client: httpx.Client) -> None:
    body = heartbeat("auth-a", "auth-orders")
    assert_error(client.post("/v1/brokers/heartbeat", json=body), 401, "UNAUTHORIZED")
    assert_error(client.post("/v1/brokers/heartbeat", json=body,
                             headers={TOKEN_HEADER: "not-the-token"}), 401, "UNAUTHORIZED")
    # checked before the body: no token and a bad body is still 401, not 400
    assert_error(client.post("/v1/brokers/heartbeat", json={"x": 1}), 401, "UNAUTHORIZED")
    assert_error(client.get("/v1/routes/auth-orders"), 404, "TOPIC_NOT_FOUND")

    assert client.post("/v1/brokers/heartbeat", json=body, headers=AUTH).status_code == 200
    # reading routes and the cluster view stays open
    assert client.get("/v1/routes/auth-orders").status_code == 200
    names = [b["broker_name"] for b in client.get("/v1/cluster").json()["brokers"]]
    assert "auth-a" in names


def test_deregistration_needs_the_token_and_a_known_broker(client: httpx.Client) -> None:
    client.post("/v1/brokers/heartbeat", json=heartbeat("auth-b", "auth-gone"),
                headers=AUTH).raise_for_status()
    assert_error(client.delete("/v1/brokers/auth-b"), 401, "UNAUTHORIZED")
    assert client.get("/v1/routes/auth-gone").status_code == 200

    assert_error(client.delete("/v1/brokers/nonexistent", headers=AUTH), 404, "BROKER_NOT_FOUND")
    assert_error(client.delete("/v1/brokers/auth-b", params={"address": "http://127.0.0.1:1"},
                               headers=AUTH), 404, "BROKER_NOT_FOUND")
    assert client.delete("/v1/brokers/auth-b", headers=AUTH).status_code == 200
    assert_error(client.get("/v1/routes/auth-gone"), 404, "TOPIC_NOT_FOUND")
    assert_error(client.delete("/v1/brokers/auth-b", headers=AUTH), 404, "BROKER_NOT_FOUND")


def test_broker_registers_and_leaves_with_the_token(
        client: httpx.Client, nameserver: ServiceProcess, redis_server: RedisServer,
        tmp_path: Path) -> None:
    with run_broker(tmp_path, redis_server.url, nameservers=nameserver.url,
                    broker_name="auth-broker") as broker:
        broker.create_topic("auth-live", queues=3)
        route = client.get("/v1/routes/auth-live")  # registered at creation, token accepted
        assert route.status_code == 200, route.text
        assert route.json()["queues"][0]["broker_name"] == "auth-broker"
    # a clean stop deregistered it: the route is gone at once, not after the expiry
    deadline = time.monotonic() + 5
    while client.get("/v1/routes/auth-live").status_code == 200:
        assert time.monotonic() < deadline, "the broker's goodbye was refused"
        time.sleep(0.1)
    assert "auth-broker" not in [b["broker_name"]
                                 for b in client.get("/v1/cluster").json()["brokers"]]
