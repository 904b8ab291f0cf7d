"""The nameserver as a real process: heartbeats, routes, cluster view, errors, expiry, metrics."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.clock import now_ms
from tests.support.procs import ServiceProcess, free_port

pytestmark = pytest.mark.integration

EXPIRY_S = 2.0  # short broker expiry for this module's nameserver


@pytest.fixture(scope="module")
def nameserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    port = free_port()
    env = {"TIDEMQ_NAMESRV_PORT": str(port), "TIDEMQ_NAMESRV_BROKER_EXPIRY_S": str(EXPIRY_S),
           "TIDEMQ_NAMESRV_EXPIRY_CHECK_INTERVAL_S": "0.1"}
    proc = ServiceProcess("nameserver", port, env, tmp_path_factory.mktemp("ns")).start()
    yield proc
    assert proc.stop() in (0, -15), proc.logs()[-3000:]


@pytest.fixture
def client(nameserver: ServiceProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=nameserver.url, timeout=5.0) as c:
        yield c


def heartbeat(name: str, topics: dict[str, dict[str, Any]], cluster: str = "c1",
              address: str | None = None) -> dict[str, Any]:
    return {"cluster": cluster, "broker_name": name,
            "address": address or f"http://127.0.0.1:1{len(name)}911", "topics": topics}


def test_heartbeat_then_route(client: httpx.Client) -> None:
    resp = client.post("/v1/brokers/heartbeat",
                       json=heartbeat("svc-a", {"svc-orders": {"queues": 8, "perm": "rw"}},
                                      address="http://127.0.0.1:20911"))
    assert resp.status_code == 200
    assert resp.json() == {}

    route = client.get("/v1/routes/svc-orders")
    assert route.status_code == 200
    assert route.json() == {"topic": "svc-orders", "queues": [
        {"broker_name": "svc-a", "address": "http://127.0.0.1:20911", "queues": 8, "perm": "rw",
         "replicas": []}]}


def test_two_brokers_one_topic_and_cluster_view(client: httpx.Client) -> None:
    before_ms = now_ms()
    for name, queues in (("svc-c2", 4), ("svc-c1", 2)):
        client.post("/v1/brokers/heartbeat", json=heartbeat(
            name, {"svc-shared": {"queues": queues, "perm": "rw"}},
            address=f"http://127.0.0.1:{30000 + queues}")).raise_for_status()

    route = client.get("/v1/routes/svc-shared").json()
    assert [(q["broker_name"], q["queues"]) for q in route["queues"]] == [
        ("svc-c1", 2), ("svc-c2", 4)]

    brokers = {b["broker_name"]: b for b in client.get("/v1/cluster").json()["brokers"]}
    assert brokers["svc-c1"]["cluster"] == "c1"
    assert brokers["svc-c1"]["address"] == "http://127.0.0.1:30002"
    assert brokers["svc-c1"]["topics"] == {"svc-shared": {"queues": 2, "perm": "rw"}}
    assert brokers["svc-c1"]["last_heartbeat_ms"] >= before_ms


def test_heartbeat_replaces_topics(client: httpx.Client) -> None:
    client.post("/v1/brokers/heartbeat", json=heartbeat(
        "svc-r", {"svc-gone": {"queues": 1, "perm": "rw"}})).raise_for_status()
    client.post("/v1/brokers/heartbeat", json=heartbeat(
        "svc-r", {"svc-kept": {"queues": 1, "perm": "r"}})).raise_for_status()

    assert client.get("/v1/routes/svc-gone").status_code == 404
    assert client.get("/v1/routes/svc-kept").json()["queues"][0]["perm"] == "r"


def test_unknown_topic_is_404_topic_not_found(client: httpx.Client) -> None:
    resp = client.get("/v1/routes/no-such-topic")
    assert resp.status_code == 404
    body = resp.json()
    assert set(body) == {"code", "message"}
    assert body["code"] == "TOPIC_NOT_FOUND"
    assert "no-such-topic" in body["message"]


def test_invalid_topic_name_in_route(client: httpx.Client) -> None:
    resp = client.get("/v1/routes/bad name!")
    assert resp.status_code == 400
    assert resp.json()["code"] == "INVALID_TOPIC_NAME"


@pytest.mark.parametrize(("body", "field"), [
    ({"broker_name": "b", "address": "http://x:1", "topics": {}}, "cluster"),
    ({"cluster": "c", "broker_name": "", "address": "http://x:1", "topics": {}}, "broker_name"),
    ({"cluster": "c", "broker_name": "b", "address": "x:1", "topics": {}}, "address"),
    ({"cluster": "c", "broker_name": "b", "address": "http://x:1"}, "topics"),
    ({"cluster": "c", "broker_name": "b", "address": "http://x:1",
      "topics": {"t": {"queues": 0, "perm": "rw"}}}, "topics.t.queues"),
    ({"cluster": "c", "broker_name": "b", "address": "http://x:1",
      "topics": {"t": {"queues": "8", "perm": "rw"}}}, "topics.t.queues"),
    ({"cluster": "c", "broker_name": "b", "address": "http://x:1",
      "topics": {"t": {"queues": 8, "perm": "rwx"}}}, "topics.t.perm"),
    ({"cluster": "c", "broker_name": "b", "address": "http://x:1",
      "topics": {"bad name": {"queues": 8, "perm": "rw"}}}, "topics"),
    ([1, 2], ""),
])
def test_malformed_heartbeat_is_400_naming_the_field(client: httpx.Client, body: Any,
                                                     field: str) -> None:
    resp = client.post("/v1/brokers/heartbeat", json=body)
    assert resp.status_code == 400, resp.text
    answer = resp.json()
    assert answer["code"] == "BAD_REQUEST"
    assert field in answer["message"]


def test_heartbeat_that_is_not_json_is_400(client: httpx.Client) -> None:
    resp = client.post("/v1/brokers/heartbeat", content=b"{not json",
                       headers={"content-type": "application/json"})
    assert resp.status_code == 400
    assert resp.json()["code"] == "BAD_REQUEST"


def test_silent_broker_is_dropped_after_expiry(client: httpx.Client) -> None:
    client.post("/v1/brokers/heartbeat", json=heartbeat(
        "svc-silent", {"svc-expiring": {"queues": 2, "perm": "rw"}})).raise_for_status()
    assert client.get("/v1/routes/svc-expiring").status_code == 200

    deadline = time.monotonic() + EXPIRY_S + 5
    while client.get("/v1/routes/svc-expiring").status_code == 200:
        assert time.monotonic() < deadline, "broker was not dropped after its expiry"
        time.sleep(0.1)
    names = [b["broker_name"] for b in client.get("/v1/cluster").json()["brokers"]]
    assert "svc-silent" not in names
    metrics = client.get("/metrics").text
    expired = [line for line in metrics.splitlines()
               if line.startswith("tidemq_nameserver_brokers_expired_total")]
    assert expired and float(expired[0].split()[-1]) >= 1


def test_unregister_removes_broker_at_once(client: httpx.Client) -> None:
    client.post("/v1/brokers/heartbeat", json=heartbeat(
        "svc-bye", {"svc-bye-topic": {"queues": 1, "perm": "rw"}},
        address="http://127.0.0.1:40000")).raise_for_status()
    stale = client.delete("/v1/brokers/svc-bye", params={"address": "http://127.0.0.1:1"})
    assert stale.status_code == 404 and stale.json()["code"] == "BROKER_NOT_FOUND"
    assert client.get("/v1/routes/svc-bye-topic").status_code == 200

    assert client.delete("/v1/brokers/svc-bye",
                         params={"address": "http://127.0.0.1:40000"}).status_code == 200
    assert client.get("/v1/routes/svc-bye-topic").status_code == 404


def test_health_and_metrics(client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    client.post("/v1/brokers/heartbeat", json=heartbeat(
        "svc-m", {"svc-metrics": {"queues": 1, "perm": "rw"}})).raise_for_status()
    client.get("/v1/routes/svc-metrics")
    resp = client.get("/metrics")
    assert resp.status_code == 200
    text = resp.text
    for name in ("tidemq_nameserver_brokers ", "tidemq_nameserver_topics ",
                 "tidemq_nameserver_heartbeats_total ",
                 'tidemq_nameserver_route_lookups_total{result="found"} ',
                 'tidemq_nameserver_route_lookups_total{result="not_found"} '):
        assert name in text, name
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    # tidemq's own, and the standard process and platform collectors
    assert all(line.startswith(("tidemq_", "process_", "python_")) for line in samples)
    assert any(line.startswith("process_cpu_seconds_total ") for line in samples)
