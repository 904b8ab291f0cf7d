"""`tidemq up` with TIDEMQ_LOG_FORMAT=json: its notices and its children's logs are JSON lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.procs import free_port
from tests.support.up import UpRun

pytestmark = pytest.mark.integration


def parsed(text: str) -> list[dict[str, Any]]:
    """Every non-empty line as a JSON object (fails on any other line)."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_up_notices_and_children_logs_are_json_lines(tmp_path: Path) -> None:
    up = UpRun(tmp_path, "--nameserver-port", str(free_port()), "--broker-port",
               str(free_port()), "--grpc-port", "0", "--skip", "checker", "--skip",
               "scheduler", "--skip", "console", "--no-metrics",
               env={"TIDEMQ_LOG_FORMAT": "json"})
    try:
        up.wait_for("tidemq is up")
        up.wait_for("cluster token")
        assert up.stop() == 0, up.output()
    finally:
        up.kill()
    lines = parsed(up.output())  # stdout and stderr: nothing but JSON lines
    assert {line["service"] for line in lines} == {"up"}
    messages = [line["message"] for line in lines]
    assert any(m.startswith("✓ nameserver ready at") for m in messages), messages
    [is_up] = [line for line in lines if line["message"].startswith("tidemq is up")]
    assert set(is_up["endpoints"]) >= {"nameserver", "broker"}
    assert any(m.startswith("stopped broker") for m in messages), messages
    for line in lines:
        assert line["time"].endswith("Z") and line["logger"] == "tidemq.up"
    for service in ("nameserver", "broker"):
        logged = parsed((up.data_dir / "logs" / f"{service}.log").read_text())
        assert logged[0]["message"] == f"tidemq up: {service} starting"  # the run's banner
        assert logged[1:] and {line["service"] for line in logged[1:]} == {service}
