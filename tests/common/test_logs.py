"""Service logs: TIDEMQ_LOG_FORMAT=json from a real process, the ids of the request in scope, and
a bad log level or format stopping every service with one line and exit status 2."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from tests.support.procs import REPO, ServiceProcess, free_port
from tests.support.wait import wait_until
from tidemq_server.common import logs
from tidemq_server.common.constants import LOG_LEVELS, REQUEST_ID_HEADER
from tidemq_server.common.logs import JsonFormatter, RequestIds, note_message_ids

# every service's module and the prefix of its variables
SERVICES = [("nameserver", "TIDEMQ_NAMESRV_"), ("broker", "TIDEMQ_BROKER_"),
            ("checker", "TIDEMQ_CHECKER_"), ("scheduler", "TIDEMQ_SCHEDULER_"),
            ("metrics", "TIDEMQ_METRICS_"), ("console", "TIDEMQ_CONSOLE_")]


def json_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a log file, each parsed as one JSON object (fails on any other line)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_service(module: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMQ_")}
    return subprocess.run([sys.executable, "-m", f"tidemq_server.{module}"], cwd=REPO,
                          env={**base, **env}, capture_output=True, text=True, timeout=60)


# --- a real process ---------------------------------------------------------------------------

@pytest.mark.integration
def test_nameserver_logs_json_lines_with_the_request_id(tmp_path: Path) -> None:
    port = free_port()
    ns = ServiceProcess("nameserver", port, {"TIDEMQ_NAMESRV_PORT": str(port),
                                             "TIDEMQ_NAMESRV_LOG_LEVEL": "info",
                                             "TIDEMQ_LOG_FORMAT": "json"}, tmp_path).start()
    try:
        resp = httpx.post(f"{ns.url}/v1/brokers/heartbeat", headers={
            REQUEST_ID_HEADER: "req-42"}, json={
            "cluster": "logs", "broker_name": "broker-logs", "address": "http://127.0.0.1:1",
            "topics": {}})
        assert resp.status_code == 200, resp.text
        registered = wait_until(lambda: [line for line in json_lines(ns.log_path)
                                         if "broker-logs/0 registered" in line["message"]],
                                what="the registration's log line")
    finally:
        ns.stop()
    lines = json_lines(ns.log_path)  # every line is one JSON object
    assert len(lines) >= 3
    for line in lines:
        assert {"time", "level", "service", "logger", "message"} <= line.keys(), line
        assert line["service"] == "nameserver"
        assert line["time"].endswith("Z")
        stamp = datetime.fromisoformat(line["time"].replace("Z", "+00:00"))
        assert stamp.utcoffset() == timedelta(0)
    [line] = registered
    assert line["level"] == "INFO"
    assert line["logger"] == "tidemq_server.nameserver.registry"
    assert line["request_id"] == "req-42"
    assert not any("request_id" in line for line in lines
                   if "ready on" in line["message"])  # start-up lines: no request in scope


# --- bad settings at start --------------------------------------------------------------------

@pytest.mark.integration
@pytest.mark.parametrize(("module", "prefix"), SERVICES)
def test_bad_log_level_is_one_line_naming_the_variable_and_exit_2(module: str,
                                                                  prefix: str) -> None:
    done = run_service(module, {f"{prefix}LOG_LEVEL": "verbose",
                                f"{prefix}PORT": str(free_port())})
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert f"{prefix}LOG_LEVEL" in done.stderr
    assert "verbose" in done.stderr
    assert ", ".join(LOG_LEVELS) in done.stderr


@pytest.mark.integration
def test_bad_log_format_is_one_line_and_exit_2() -> None:
    done = run_service("nameserver", {"TIDEMQ_LOG_FORMAT": "xml",
                                      "TIDEMQ_NAMESRV_PORT": str(free_port())})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "nameserver: bad setting: TIDEMQ_LOG_FORMAT='xml': unknown log format 'xml': use one "
        "of text, json"]


# --- the formatter and the ids in scope -------------------------------------------------------

def record(message: str, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            exc_info = sys.exc_info()
    return logging.LogRecord("services.x", logging.ERROR, __file__, 1, message, None, exc_info)


def test_json_line_has_exc_info_as_a_string_and_stays_one_line() -> None:
    line = JsonFormatter("broker").format(record("bad\nthing", exc=True))
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["message"] == "bad\nthing"
    assert parsed["service"] == "broker" and parsed["level"] == "ERROR"
    assert isinstance(parsed["exc_info"], str) and "ValueError: boom" in parsed["exc_info"]
    assert "request_id" not in parsed and "message_id" not in parsed


def test_request_and_message_ids_in_scope_reach_the_json_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    async def send(request: Request) -> PlainTextResponse:
        note_message_ids(request.query_params.getlist("id"))
        seen.append(JsonFormatter("broker").format(record("stored")))
        return PlainTextResponse("ok")

    app = RequestIds(Starlette(routes=[Route("/send", send)]))
    monkeypatch.setattr(logs, "_ids_wanted", True)  # as setup_logging(fmt="json") leaves it

    async def two_sends() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://broker") as client:
            await client.get("/send?id=m1", headers={REQUEST_ID_HEADER: "r1"})
            await client.get("/send?id=m2&id=m3")

    asyncio.run(two_sends())
    one, many = (json.loads(line) for line in seen)
    assert (one["request_id"], one["message_id"]) == ("r1", "m1")
    assert many["message_ids"] == ["m2", "m3"] and len(many["request_id"]) == 16
    assert JsonFormatter("broker").format(record("after")).find("request_id") == -1


def test_text_logs_set_no_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "_ids_wanted", False)  # as setup_logging(fmt="text") leaves it
    note_message_ids(["m1"])
    assert logs.message_ids.get() == ()
