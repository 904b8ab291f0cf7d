"""Which Spark master the job runs on, and who the serve-only sidecar reports: the job that
wrote the files (its master, application id, mode and times), not the sidecar's own settings."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.metrics import parse_exposition, promtool, sample
from tidemq_server.common.constants import METRICS_SPARK_MASTER
from tidemq_server.metrics.job import choose_master, parse_args
from tidemq_server.metrics.liveness import (
    JobInfo,
    Liveness,
    LivenessState,
    liveness_path,
    parse_liveness,
    read_liveness,
    render_liveness,
)
from tidemq_server.metrics.settings import MetricsSettings
from tidemq_server.metrics.sidecar import JobRunner, JobState, health_lines

SPARK = "spark://127.0.0.1:7077"


def test_a_configured_master_wins_then_spark_submits_then_local() -> None:
    assert choose_master(SPARK, env={"PYSPARK_GATEWAY_PORT": "4242"}) == SPARK
    # under spark-submit (the driver's JVM already exists): keep its --master
    assert choose_master("", env={"PYSPARK_GATEWAY_PORT": "4242"}) is None
    assert choose_master("", env={}) == METRICS_SPARK_MASTER


def test_the_entry_point_reads_its_master_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["--broker-url", "http://b:10911", "--output", "o.prom", "--checkpoint", "c"]
    monkeypatch.setenv("TIDEMQ_METRICS_MASTER", SPARK)
    assert parse_args(argv)[1].master == SPARK
    assert parse_args([*argv, "--master", "local[2]"])[1].master == "local[2]"
    monkeypatch.delenv("TIDEMQ_METRICS_MASTER")
    assert parse_args([*argv, "--topic", "Events"])[0].topic == "Events"
    assert parse_args(argv)[1].master == ""  # spark-submit's, else local[*] (choose_master)


def test_the_job_names_itself_in_the_liveness_file(tmp_path: Path) -> None:
    path = liveness_path(tmp_path / "metrics.prom")
    live = Liveness(path)
    live.started(SPARK, "app-20261128-0001", "once", now=100.0)
    live.completed(5, now=103.0)
    live.finished(now=104.0)
    job = JobInfo(SPARK, "app-20261128-0001", "once", 100.0, 104.0)
    assert read_liveness(path) == LivenessState(103.0, 103.0, job)
    odd = JobInfo('spark://a"b\\c:7077', "x", "continuous", 1.0)
    assert parse_liveness(render_liveness(LivenessState(job=odd))).job == odd
    restarted = Liveness(path)  # a later run: a new identity, finished cleared
    restarted.started("local[*]", "local-1", "continuous", now=200.0)
    assert read_liveness(path).job == JobInfo("local[*]", "local-1", "continuous", 200.0)


@pytest.mark.integration  # runs promtool
def test_serve_only_reports_the_external_job_and_counts_it_up_while_fresh(
        tmp_path: Path) -> None:
    settings = MetricsSettings(data_dir=tmp_path, run_job=False, stale_after_s=900.0)
    runner = JobRunner(settings)
    nothing = runner.status(settings.exposition_path)
    assert nothing["state"] == JobState.EXTERNAL and nothing["up"] is False
    assert nothing["master"] == "" and nothing["app_id"] is None

    now = time.time()  # a cron --once run 10 minutes ago, on a standalone master
    (tmp_path / "metrics.prom").write_text("tidemq_metrics_batch_id 7\n")
    live = Liveness(liveness_path(settings.exposition_path))
    live.started(SPARK, "app-1", "once", now=now - 620)
    live.completed(3, now=now - 610)
    live.finished(now=now - 600)
    status = runner.status(settings.exposition_path)
    assert status["state"] == "external" and status["up"] is True
    assert (status["master"], status["app_id"], status["mode"]) == (SPARK, "app-1", "once")
    assert status["last_batch_id"] == 7 and status["batches_written"] is None
    assert 600 <= status["job_finished_age_s"] < 660
    text = health_lines(runner, status)
    promtool("check", "metrics", stdin=text)
    samples = parse_exposition(text)
    assert sample(samples, "tidemq_metrics_job_up") == 1
    assert sample(samples, "tidemq_metrics_job_stale_after_seconds") == 900

    late = JobRunner(MetricsSettings(data_dir=tmp_path, run_job=False, stale_after_s=300.0))
    stale = late.status(settings.exposition_path)
    assert stale["up"] is False  # the run is older than the threshold: down
    assert sample(parse_exposition(health_lines(late, stale)), "tidemq_metrics_job_up") == 0


def test_an_own_finished_run_exports_no_threshold(tmp_path: Path) -> None:
    runner = JobRunner(MetricsSettings(data_dir=tmp_path, mode="once"))
    runner.state = JobState.DONE
    status = runner.status(tmp_path / "metrics.prom")
    assert status["up"] is True and status["stale_after_s"] is None
    names = {name for name, _ in parse_exposition(health_lines(runner, status))}
    assert "tidemq_metrics_job_up" in names
    assert "tidemq_metrics_job_stale_after_seconds" not in names
