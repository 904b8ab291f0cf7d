"""The job's liveness: every completed trigger counts, empty polls included; the newest event's
age is a separate figure. Unit checks of the file, then the query on real Spark (the shared
session) over a real broker topic that gets no events."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.broker import BrokerHandle, unique
from tests.support.metrics import Script, encode, parse_exposition, promtool, put_events, sample
from tests.support.wait import wait_until
from tidemq_server.metrics.events import parse_event
from tidemq_server.metrics.exposition import BatchInfo, render
from tidemq_server.metrics.job import ExpositionWriter, JobConfig, start_query
from tidemq_server.metrics.liveness import (
    Liveness,
    LivenessState,
    liveness_path,
    parse_liveness,
    read_liveness,
    render_liveness,
)
from tidemq_server.metrics.rollup import python_rollup
from tidemq_server.metrics.settings import MetricsSettings
from tidemq_server.metrics.sidecar import JobRunner, health_lines

COMPLETED = "tidemq_metrics_last_batch_completed_timestamp_seconds"
NEWEST = "tidemq_metrics_newest_event_read_timestamp_seconds"


def test_the_liveness_file_sits_beside_the_exposition(tmp_path: Path) -> None:
    assert liveness_path(tmp_path / "metrics.prom") == tmp_path / "metrics-liveness.prom"


@pytest.mark.integration  # runs promtool (make test-unit needs nothing but the venv)
def test_empty_polls_advance_liveness_but_not_the_newest_event(tmp_path: Path) -> None:
    path = liveness_path(tmp_path / "metrics.prom")
    assert read_liveness(path) == LivenessState()  # nothing written yet
    live = Liveness(path)
    live.completed(3, now=100.0)  # a micro-batch that read 3 events
    live.completed(0, now=105.0)  # empty polls
    live.completed(0, now=110.0)
    assert read_liveness(path) == LivenessState(completed_s=110.0, newest_event_s=100.0)
    assert read_liveness(path).ages(now=112.0) == (2.0, 12.0)
    text = path.read_text()
    promtool("check", "metrics", stdin=text)
    samples = parse_exposition(text)
    assert sample(samples, COMPLETED) == 110.0 and sample(samples, NEWEST) == 100.0

    restarted = Liveness(path)  # a restarted job keeps the time of the newest event
    restarted.completed(0, now=200.0)
    assert read_liveness(path) == LivenessState(completed_s=200.0, newest_event_s=100.0)


@pytest.mark.integration  # runs promtool (make test-unit needs nothing but the venv)
def test_no_event_read_yet_leaves_that_time_out() -> None:
    text = render_liveness(LivenessState(completed_s=5.0))
    promtool("check", "metrics", stdin=text)
    assert parse_liveness(text) == LivenessState(completed_s=5.0)
    assert LivenessState(completed_s=5.0).ages(now=7.5) == (2.5, None)
    assert parse_liveness(f"{COMPLETED} nonsense\n") == LivenessState()


@pytest.mark.integration  # runs promtool (make test-unit needs nothing but the venv)
def test_the_sidecar_serves_both_ages(tmp_path: Path) -> None:
    settings = MetricsSettings(data_dir=tmp_path, run_job=False)
    runner = JobRunner(settings)
    empty = runner.status(settings.exposition_path)
    assert empty["last_batch_completed_age_s"] is None and empty["newest_event_age_s"] is None
    samples = parse_exposition(health_lines(runner, empty))
    assert sample(samples, "tidemq_metrics_last_batch_completed_age_seconds") == -1
    assert sample(samples, "tidemq_metrics_newest_event_age_seconds") == -1

    now = time.time()
    live = Liveness(liveness_path(settings.exposition_path))
    live.completed(1, now=now - 600)
    live.completed(0, now=now - 1)
    status = runner.status(settings.exposition_path)
    assert 0 <= status["last_batch_completed_age_s"] < 30
    assert 600 <= status["newest_event_age_s"] < 630
    script = Script("g", "Orders")
    script.ended("commit", 10)
    rollups = python_rollup(parse_event(encode(b)) for b in script.bodies)
    text = (render(rollups, BatchInfo(1, now)) + live.path.read_text()
            + health_lines(runner, status))
    promtool("check", "metrics", stdin=text)  # one exposition, no family twice


@pytest.mark.integration
def test_idle_triggers_of_a_real_query_keep_it_live(spark: Any, events_broker: BrokerHandle,
                                                    token: str, job_dir: Path) -> None:
    topic = events_broker.create_topic(unique("Quiet"), queues=1)
    script = Script("g", "Orders")
    script.ended("commit", 10)
    put_events(events_broker.url, token, topic, script.bodies)
    cfg = JobConfig(broker_url=events_broker.url, token=token, topic=topic,
                    output=job_dir / "metrics.prom", checkpoint=job_dir / "checkpoint",
                    trigger_interval_s=1.0)
    writer = ExpositionWriter(cfg.output)
    query = start_query(spark, cfg, writer)
    try:
        # the query's first batch (the two events): its planning starts Spark's Python workers,
        # which took over 45 s on a loaded 2-core machine; as long as test_sidecar_quiet waits
        deadline = time.monotonic() + 120
        while writer.liveness.state.newest_event_s is None:
            assert query.isActive and time.monotonic() < deadline, query.exception()
            time.sleep(0.2)
        read_at = writer.liveness.state.newest_event_s
        triggers = writer.liveness.triggers
        # no event arrives: three more triggers complete, each an empty poll
        wait_until(lambda: writer.liveness.triggers >= triggers + 3, what="three empty polls")
        state = read_liveness(liveness_path(cfg.output))
        completed_age, event_age = state.ages(time.time())
        assert completed_age is not None and completed_age < 3
        assert state.newest_event_s == pytest.approx(read_at, abs=0.01)
        # the newest event aged while the polls completed (three triggers: over two intervals)
        assert state.completed_s is not None
        assert state.completed_s - read_at >= cfg.trigger_interval_s
        assert event_age is not None and event_age > completed_age
        assert writer.batches == 1  # no micro-batch ran for the empty polls
    finally:
        query.stop()
