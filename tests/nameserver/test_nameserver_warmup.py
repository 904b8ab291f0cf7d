"""A freshly started nameserver does not yet know the topics of brokers that have not
re-registered: for its warm-up an unknown topic answers 503 UNAVAILABLE (retriable) with
Retry-After, and 404 TOPIC_NOT_FOUND only afterwards."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.procs import ServiceProcess, free_port
from tidemq_server.common.constants import BROKER_HEARTBEAT_INTERVAL_S
from tidemq_server.nameserver.app import build_app
from tidemq_server.nameserver.settings import NameserverSettings

pytestmark = pytest.mark.integration

WARMUP_S = 3.0  # short warm-up for this module's nameserver


@pytest.fixture
def nameserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    port = free_port()
    env = {"TIDEMQ_NAMESRV_PORT": str(port), "TIDEMQ_NAMESRV_WARMUP_S": str(WARMUP_S)}
    proc = ServiceProcess("nameserver", port, env, tmp_path_factory.mktemp("ns-warm")).start()
    yield proc
    assert proc.stop() in (0, -15), proc.logs()[-3000:]


def test_unknown_topic_is_503_during_warmup_then_404(nameserver: ServiceProcess) -> None:
    started = time.monotonic()
    with httpx.Client(base_url=nameserver.url, timeout=5.0) as client:
        client.post("/v1/brokers/heartbeat", json={
            "cluster": "c1", "broker_name": "warm-a", "address": "http://127.0.0.1:10911",
            "topics": {"warm-known": {"queues": 2, "perm": "rw"}}}).raise_for_status()

        # a topic a broker did register is routed at once (asked first: the 503 below shows
        # this was still the warm-up, however slow the machine)
        assert client.get("/v1/routes/warm-known").json()["queues"][0]["broker_name"] == "warm-a"
        assert client.get("/v1/routes/bad name!").status_code == 400  # still validated first
        early = client.get("/v1/routes/warm-unknown")
        assert early.status_code == 503
        assert early.json()["code"] == "UNAVAILABLE"
        message = early.json()["message"]
        assert "'warm-unknown'" in message and "started" in message
        assert f"re-register within {WARMUP_S:.0f} s" in message
        retry_after = int(early.headers["Retry-After"])
        assert 1 <= retry_after <= math.ceil(WARMUP_S)

        time.sleep(max(0.0, WARMUP_S - (time.monotonic() - started)) + 0.2)
        late = client.get("/v1/routes/warm-unknown")
        assert late.status_code == 404 and late.json()["code"] == "TOPIC_NOT_FOUND"
        assert "Retry-After" not in late.headers
        metrics = client.get("/metrics").text
    assert 'tidemq_nameserver_route_lookups_total{result="warming_up"} 1.0' in metrics
    assert 'tidemq_nameserver_route_lookups_total{result="not_found"} 1.0' in metrics


def test_warmup_defaults_to_the_heartbeat_interval_and_is_documented(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIDEMQ_NAMESRV_WARMUP_S", raising=False)
    assert NameserverSettings().warmup_s == BROKER_HEARTBEAT_INTERVAL_S
    monkeypatch.setenv("TIDEMQ_NAMESRV_WARMUP_S", "-1")
    with pytest.raises(ValueError):
        NameserverSettings()
    spec = build_app(NameserverSettings(warmup_s=0)).openapi()
    responses = spec["paths"]["/v1/routes/{topic}"]["get"]["responses"]
    assert "UNAVAILABLE" in responses["503"]["description"]
    assert "TOPIC_NOT_FOUND" in responses["404"]["description"]
