"""The official RocketMQ 5 Python client's own metrics against tidemq: the broker's settings
turn them on at its gRPC door, the clients export there over OTLP when they stop, and their log
shows no error — with metrics "off" its push consumer failed on every settings answer
('NoneType' object has no attribute 'get_meter') and stopped reading its Telemetry stream."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.broker.grpc.conftest import Cluster
from tests.support.broker import unique
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration

EXPORTS = re.compile(r"^tidemq_broker_grpc_client_metric_exports_total (\S+)$", re.M)
POINTS = re.compile(r"^tidemq_broker_grpc_client_metric_points_total (\S+)$", re.M)


def errors_in(home: Path) -> list[str]:
    """Every ERROR / WARN line the clients of this session logged so far."""
    lines: list[str] = []
    for log in sorted(home.glob("logs/rocketmq_python/rocketmq_client.log*")):
        lines += [x for x in log.read_text(errors="replace").splitlines()
                  if "[ERROR]" in x or "[WARN" in x]
    return lines


def figure(cluster: Cluster, pattern: re.Pattern[str]) -> float:
    found = pattern.search(cluster.http.get(f"{cluster.broker_url}/metrics").text)
    return float(found.group(1)) if found else 0.0


def test_client_metrics_are_on_exported_to_the_door_and_log_no_error(cluster: Cluster) -> None:
    topic = cluster.topic()
    before_errors = errors_in(cluster.home)
    before = figure(cluster, EXPORTS)
    result = cluster.client("metrics", "--topic", topic, "--count", 5, "--consumer-group",
                            unique("g"), "--timeout", 30)
    assert sorted(result["received"]) == sorted(result["sent"])
    assert result["metrics_on"] == {"producer": True, "consumer": True}
    # each client's meter provider exports once more as it shuts down
    wait_until(lambda: figure(cluster, EXPORTS) >= before + 2, 15, "the clients' OTLP exports")
    assert figure(cluster, POINTS) > 0
    new = errors_in(cluster.home)[len(before_errors):]
    assert not [x for x in new if "metric" in x.lower() or "get_meter" in x], new
