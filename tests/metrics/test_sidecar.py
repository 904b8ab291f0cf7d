"""The sidecar's HTTP side: /metrics serves the batch's file plus live job gauges."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.support.metrics import Script, encode, parse_exposition, promtool, sample
from tidemq_server.common.files import write_atomic
from tidemq_server.metrics.events import parse_event
from tidemq_server.metrics.exposition import BatchInfo, render
from tidemq_server.metrics.liveness import Liveness, liveness_path
from tidemq_server.metrics.rollup import python_rollup
from tidemq_server.metrics.settings import MetricsSettings
from tidemq_server.metrics.sidecar import create_sidecar_app


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    monkeypatch.setenv("TIDEMQ_METRICS_PORT", "19464")
    monkeypatch.setenv("TIDEMQ_METRICS_MODE", "once")
    monkeypatch.setenv("TIDEMQ_METRICS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("TIDEMQ_METRICS_SPARK_CONF", "spark.driver.memory=1g, spark.x=y")
    settings = MetricsSettings()
    assert settings.port == 19464 and settings.master == "local[*]"
    job = settings.job_config()
    assert job.once and job.checkpoint == tmp_path / "checkpoint"
    assert job.output == tmp_path / "metrics.prom"
    assert dict(settings.session_config().extra) == {"spark.driver.memory": "1g",
                                                      "spark.x": "y"}


@pytest.mark.integration  # runs promtool (make test-unit needs nothing but the venv)
async def test_metrics_serves_the_file_and_job_gauges(tmp_path: Path) -> None:
    settings = MetricsSettings(data_dir=tmp_path, run_job=False)
    app = create_sidecar_app(settings)
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), \
            httpx.AsyncClient(transport=transport, base_url="http://sidecar") as client:
        assert (await client.get("/healthz")).json() == {"status": "ok"}
        before = await client.get("/metrics")
        assert before.status_code == 200
        assert before.headers["content-type"].startswith("text/plain; version=0.0.4")
        samples = parse_exposition(before.text)
        assert sample(samples, "tidemq_metrics_job_up") == 0
        assert sample(samples, "tidemq_metrics_last_batch_completed_age_seconds") == -1
        assert sample(samples, "tidemq_metrics_newest_event_age_seconds") == -1

        script = Script("g", "Orders")
        script.ended("commit", 1500)
        rollups = python_rollup(parse_event(encode(b)) for b in script.bodies)
        write_atomic(settings.exposition_path, render(rollups, BatchInfo(3, 1.0)))
        Liveness(liveness_path(settings.exposition_path)).completed(2)  # the job's listener
        text = (await client.get("/metrics")).text
        promtool("check", "metrics", stdin=text)
        samples = parse_exposition(text)
        assert sample(samples, "tidemq_transaction_commits_total", producer_group="g",
                      topic="Orders", source="producer") == 1
        assert 0 <= sample(samples, "tidemq_metrics_last_batch_completed_age_seconds") < 60
        assert 0 <= sample(samples, "tidemq_metrics_newest_event_age_seconds") < 60
        assert sample(samples, "tidemq_metrics_last_batch_completed_timestamp_seconds") > 0
        # run_job off: the job is elsewhere; a trigger it completed just now counts it up
        assert sample(samples, "tidemq_metrics_job_up") == 1
        status = (await client.get("/v1/status")).json()
        assert status["state"] == "external" and status["restarts"] == 0
        assert status["up"] is True and status["last_batch_id"] == 3
