"""Prometheus alert rules (deploy/prometheus/alerts.yml) under `promtool test rules`: the metrics
job's staleness alert follows its liveness, not the age of the newest event."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.support.metrics import promtool
from tests.support.procs import REPO
from tidemq_server.metrics.settings import MetricsSettings
from tidemq_server.metrics.sidecar import JobRunner, health_lines

PROMETHEUS = REPO / "deploy" / "prometheus"
NAME_RE = re.compile(r"\b(tidemq_[a-z_]+)\b")


def alert_rules() -> list[dict]:
    rules = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    return [r for g in rules["groups"] for r in g["rules"]]


@pytest.mark.integration  # runs promtool (make test-unit needs nothing but the venv)
def test_prometheus_loads_the_alerts_and_promtool_tests_them() -> None:
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    assert "alerts.yml" in config["rule_files"]
    promtool("check", "rules", str(PROMETHEUS / "alerts.yml"))
    out = promtool("test", "rules", "alerts.test.yml", cwd=str(PROMETHEUS))
    assert "SUCCESS" in out
    tests = yaml.safe_load((PROMETHEUS / "alerts.test.yml").read_text())
    tested = {case["alertname"] for t in tests["tests"] for case in t["alert_rule_test"]}
    assert tested == {r["alert"] for r in alert_rules()}


def test_the_staleness_alert_uses_the_liveness_figure_the_sidecar_exports(tmp_path: Path) -> None:
    runner = JobRunner(MetricsSettings(run_job=False))
    exported = set(NAME_RE.findall(health_lines(runner, runner.status(tmp_path / "m.prom"))))
    (stalled,) = [r for r in alert_rules() if r["alert"] == "TidemqMetricsJobStalled"]
    assert NAME_RE.findall(stalled["expr"]) == ["tidemq_metrics_last_batch_completed_age_seconds",
                                                "tidemq_metrics_job_stale_after_seconds"]
    used = {name for r in alert_rules() for name in NAME_RE.findall(r["expr"])}
    assert used <= exported
