"""Every service's ``/metrics`` as Prometheus users judge it: ``promtool check metrics`` passes
(no abbreviated units, counters named ``_total``), every family has a real description (no
``store: fsyncs`` placeholder), running totals are counters and levels are gauges, and the
standard ``process_*`` / ``python_*`` collectors are there. The whole system runs as
``tidemq up`` starts it, after a little traffic so the counters have moved."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.metrics import promtool
from tests.support.procs import free_port
from tests.support.up import UpRun

pytestmark = pytest.mark.integration

SERVICES = ("nameserver", "broker", "checker", "scheduler", "metrics", "console")
PLACEHOLDER = re.compile(r"^[\w -]+: \w+$")  # what a dict key dumped as a gauge looked like
STANDARD = ("process_cpu_seconds_total", "process_resident_memory_bytes", "python_info",
            "python_gc_collections_total")


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    ports = {name: free_port() for name in SERVICES}
    up = UpRun(tmp_path_factory.mktemp("prom"),
               *(arg for name, port in ports.items() for arg in (f"--{name}-port", str(port))),
               "--grpc-port", "0",
               env={"TIDEMQ_METRICS_RUN_JOB": "false"})  # the sidecar's HTTP side, no Spark
    try:
        up.wait_ready()
        urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        with httpx.Client(base_url=urls["broker"], timeout=10) as broker:
            assert broker.put("/v1/topics/Prom", json={"queues": 1}).status_code == 200
            sent = broker.post("/v1/topics/Prom/messages",
                               json={"messages": [{"body": "x"}, {"body": "y", "delay_ms": 10}]})
            assert sent.status_code == 200, sent.text
            assert broker.get("/v1/topics/Prom/queues/0/messages",
                              params={"offset": 0}).status_code == 200
        yield urls
    finally:
        up.stop()


@pytest.mark.parametrize("service", SERVICES)
def test_metrics_pass_promtool_and_the_naming_conventions(system: dict[str, str],
                                                          service: str) -> None:
    text = httpx.get(f"{system[service]}/metrics", timeout=10).text
    promtool("check", "metrics", stdin=text)
    families = list(text_string_to_metric_families(text))
    names = {f.name for f in families}
    for standard in STANDARD:
        # the parser names counter families without _total
        assert standard.removesuffix("_total") in names, f"{service}: no {standard}"
    for family in families:
        assert family.documentation, f"{service}: {family.name} has no HELP"
        assert not PLACEHOLDER.match(family.documentation), (
            f"{service}: {family.name} has a placeholder HELP {family.documentation!r}")
        assert not family.name.endswith(("_ms", "_millis", "_milliseconds")), family.name
        if family.type == "gauge":
            assert not family.name.endswith("_total"), f"{service}: gauge {family.name}"
    assert not any(n.endswith("_pid") for n in names), f"{service} exports a pid"


def test_running_totals_are_counters(system: dict[str, str]) -> None:
    def kinds(service: str) -> dict[str, str]:
        text = httpx.get(f"{system[service]}/metrics", timeout=10).text
        return {f.name: f.type for f in text_string_to_metric_families(text)}

    broker = kinds("broker")
    for name in ("tidemq_broker_store_fsyncs", "tidemq_broker_store_put_bytes",
                 "tidemq_broker_store_put_records", "tidemq_broker_simple_acked",
                 "tidemq_broker_transactions_checks_offered", "tidemq_broker_held_pulls_woken"):
        assert broker.get(name) == "counter", (name, broker.get(name))
    assert broker["tidemq_broker_store_disk_used_ratio"] == "gauge"
    scheduler = kinds("scheduler")
    assert scheduler["tidemq_scheduler_clock_offset_seconds"] == "gauge"
    assert scheduler["tidemq_scheduler_max_lateness_seconds"] == "gauge"
    assert scheduler["tidemq_scheduler_lateness_seconds"] == "histogram"


def test_the_dashboards_and_rules_use_only_exported_names(system: dict[str, str]) -> None:
    exported: set[str] = set()
    for service in SERVICES:
        text = httpx.get(f"{system[service]}/metrics", timeout=10).text
        exported |= {m.group(1) for m in re.finditer(r"^(?:# TYPE )?([a-z_:]+)", text, re.M)}
    repo = Path(__file__).resolve().parents[2]
    for path in (repo / "deploy/grafana/dashboards/tidemq.json",
                 repo / "deploy/prometheus/dashboard-rules.yml",
                 repo / "deploy/prometheus/alerts.yml"):
        for name in set(re.findall(r"\b(tidemq_(?:broker|scheduler)_[a-z_]+)", path.read_text())):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert name in exported or base in exported or (
                base + "_bucket") in exported, f"{path.name} uses {name}, which nobody exports"
