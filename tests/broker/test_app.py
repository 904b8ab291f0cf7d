"""The broker process's service endpoints: health, Prometheus metrics, OpenAPI and docs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tidemq.protocol.records._compiled import COMPILED

from tests.support.broker import BrokerHandle, run_broker
from tests.support.procs import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory,
           redis_server: RedisServer) -> Iterator[BrokerHandle]:
    with run_broker(tmp_path_factory.mktemp("harness"), redis_server.url) as handle:
        yield handle


def test_healthz_metrics_and_docs(broker: BrokerHandle) -> None:
    assert broker.http.get("/healthz").json() == {"status": "ok"}
    metrics = broker.http.get("/metrics").text
    for name in ("tidemq_broker_messages_put_total", "tidemq_broker_put_latency_seconds",
                 "tidemq_broker_store_commitlog_max_offset", "tidemq_broker_busy_rejections"):
        assert name in metrics
    # the broker runs the record core this process runs (same build, same environment)
    assert f"tidemq_record_core_compiled {1.0 if COMPILED else 0.0}" in metrics
    spec = broker.http.get("/openapi.json").json()
    send = spec["paths"]["/v1/topics/{topic}/messages"]["post"]
    schema = send["requestBody"]["content"]["application/json"]["schema"]
    assert "messages" in schema["properties"]
    assert "application/msgpack" in send["requestBody"]["content"]
    assert broker.http.get("/docs").status_code == 200
