"""The Grafana dashboard and provisioning; every panel's PromQL under `promtool test rules`."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from prometheus_client import generate_latest

from tests.deploy.topology import load_compose
from tests.support.metrics import encode, promtool, scenario
from tests.support.procs import REPO
from tidemq_server.broker.observability import (
    BROKER_STATS,
    STORE_STATS,
    TRANSACTION_STATS,
    BrokerMetrics,
)
from tidemq_server.metrics.events import parse_event
from tidemq_server.metrics.exposition import BatchInfo, render
from tidemq_server.metrics.rollup import python_rollup
from tidemq_server.metrics.settings import MetricsSettings
from tidemq_server.metrics.sidecar import JobRunner, health_lines
from tidemq_server.scheduler.metrics import SCHEDULER_STATS, SchedulerMetrics

GRAFANA = REPO / "deploy" / "grafana"
PROMETHEUS = REPO / "deploy" / "prometheus"
NAME_RE = re.compile(r"\b(tidemq_[a-z_]+)\b")


def builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_dashboard",
                                                  GRAFANA / "build_dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def panels() -> list[dict]:
    dashboard = json.loads((GRAFANA / "dashboards" / "tidemq.json").read_text())
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def test_generated_files_are_up_to_date() -> None:
    assert builder().main(["--check"]) == 0


def test_dashboard_has_the_rows_and_panels_asked_for() -> None:
    dashboard = json.loads((GRAFANA / "dashboards" / "tidemq.json").read_text())
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows == ["Transactions", "Brokers", "Scheduler"]
    titles = {p["title"] for p in panels()}
    assert {"Resolution funnel", "Checks per resolved transaction",
            "Discards by producer group", "Half-to-commit latency",
            "Messages sent per second", "Messages consumed per second", "Pending timers",
            "Delivery lateness"} <= titles
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels():
        assert panel["datasource"]["uid"] == "tidemq-prometheus"
        assert panel["targets"] and all(t["expr"] for t in panel["targets"])


@pytest.mark.integration  # runs promtool (make test-unit needs nothing but the venv)
def test_every_panel_query_is_a_tested_rule() -> None:
    fixed = builder().fixed
    rules = yaml.safe_load((PROMETHEUS / "dashboard-rules.yml").read_text())
    recorded = {r["expr"]: r["record"] for g in rules["groups"] for r in g["rules"]}
    queries = [fixed(t["expr"]) for p in panels() for t in p["targets"]]
    assert sorted(queries) == sorted(recorded)  # one rule per panel query, no other
    tests = yaml.safe_load((PROMETHEUS / "dashboard-rules.test.yml").read_text())
    tested = {case["expr"] for t in tests["tests"] for case in t["promql_expr_test"]}
    assert tested == set(recorded.values())
    promtool("check", "rules", str(PROMETHEUS / "dashboard-rules.yml"))
    out = promtool("test", "rules", "dashboard-rules.test.yml", cwd=str(PROMETHEUS))
    assert "SUCCESS" in out


def test_panels_use_names_the_services_export(tmp_path: Path) -> None:
    rollups = python_rollup(parse_event(encode(b)) for b in scenario())
    runner = JobRunner(MetricsSettings(run_job=False))
    status = runner.status(tmp_path / "metrics.prom")
    sidecar = render(rollups, BatchInfo(1, 1.0)) + health_lines(runner, status)
    exported = set(NAME_RE.findall(sidecar))
    broker = BrokerMetrics()
    broker.observe_pull("T", 1)
    broker.consumer_lag.labels("g", "T", "0").set(1)
    exported |= set(NAME_RE.findall(generate_latest(broker.registry).decode()))
    exported |= set(NAME_RE.findall(generate_latest(SchedulerMetrics().registry).decode()))
    # the scrape-time statistics, as their tables name them
    for prefix, specs in (("tidemq_scheduler_", SCHEDULER_STATS), ("tidemq_broker_store_",
                          STORE_STATS), ("tidemq_broker_", BROKER_STATS),
                          ("tidemq_broker_transactions_", TRANSACTION_STATS)):
        exported |= {prefix + (spec.name or key) + ("_total" if spec.kind == "counter" else "")
                     for key, spec in specs.items()}
    used = {name for p in panels() for t in p["targets"] for name in NAME_RE.findall(t["expr"])}
    assert used - exported == set()


def test_provisioning_matches_compose_mounts() -> None:
    datasource = yaml.safe_load(
        (GRAFANA / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    (ds,) = datasource["datasources"]
    assert ds["uid"] == "tidemq-prometheus" and ds["url"] == "http://prometheus:9090"
    provider = yaml.safe_load(
        (GRAFANA / "provisioning" / "dashboards" / "tidemq.yaml").read_text())
    path = provider["providers"][0]["options"]["path"]
    mounts = load_compose()["services"]["grafana"]["volumes"]
    assert f"./deploy/grafana/dashboards:{path}:ro" in mounts
    assert "./deploy/grafana/provisioning:/etc/grafana/provisioning:ro" in mounts
