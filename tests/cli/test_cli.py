"""The `tidemq` CLI: help texts, `cluster` against a real nameserver, the `up` plan, `up` itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from typer.testing import CliRunner

from tests.support.procs import REPO, ServiceProcess, free_port
from tests.support.up import NO_WARMUP
from tidemq_server.cli import app
from tidemq_server.cli.plan import (
    UpOptions,
    child_env,
    module_available,
    plan_services,
    redis_command,
    resolve_token,
)

WIDE = {"COLUMNS": "200"}  # rich tables must not truncate what the tests look for


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture(scope="module")
def nameserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    port = free_port()
    proc = ServiceProcess("nameserver", port, {"TIDEMQ_NAMESRV_PORT": str(port)},
                          tmp_path_factory.mktemp("cli-ns")).start()
    yield proc
    proc.stop()


# --- help -------------------------------------------------------------------------------------

def test_root_help_lists_every_command(runner: CliRunner) -> None:
    result = runner.invoke(app, ["--help"], env=WIDE)
    assert result.exit_code == 0, result.output
    for command in ("up", "topic", "send", "consume", "query", "cluster", "bench"):
        assert command in result.output
    assert "--broker" in result.output and "TIDEMQ_BROKER_URL" in result.output


@pytest.mark.parametrize(("args", "expected"), [
    (["up", "--help"], ["--broker-port", "--nameserver-port", "--data-dir", "--flush",
                        "--no-metrics"]),
    (["topic", "--help"], ["create", "list", "show"]),
    (["topic", "create", "--help"], ["--queues", "--perm"]),
    (["send", "--help"], ["--tag", "--key", "--count"]),
    (["consume", "--help"], ["--group", "--queue", "--from-offset", "--max"]),
    (["query", "--help"], ["--id", "--topic", "--key", "--begin-ms", "--end-ms"]),
])
def test_command_help(runner: CliRunner, args: list[str], expected: list[str]) -> None:
    result = runner.invoke(app, args, env=WIDE)
    assert result.exit_code == 0, result.output
    for option in expected:
        assert option in result.output


# --- against a real nameserver ----------------------------------------------------------------

@pytest.mark.integration
def test_cluster_shows_registered_brokers(runner: CliRunner, nameserver: ServiceProcess) -> None:
    httpx.post(f"{nameserver.url}/v1/brokers/heartbeat", json={
        "cluster": "cli-cluster", "broker_name": "cli-broker",
        "address": "http://127.0.0.1:10999",
        "topics": {"cli-orders": {"queues": 8, "perm": "rw"}}}).raise_for_status()

    result = runner.invoke(app, ["--nameserver", nameserver.url, "cluster"], env=WIDE)
    assert result.exit_code == 0, result.output
    for text in ("cli-cluster", "cli-broker", "http://127.0.0.1:10999", "cli-orders (8q)"):
        assert text in result.output

    result = runner.invoke(app, ["--nameserver", nameserver.url, "cluster", "--json"])
    assert result.exit_code == 0, result.output
    brokers = json.loads(result.stdout)["brokers"]
    assert {b["broker_name"] for b in brokers} >= {"cli-broker"}


@pytest.mark.integration
def test_nameserver_url_from_environment(runner: CliRunner, nameserver: ServiceProcess) -> None:
    result = runner.invoke(app, ["cluster", "--json"],
                           env={"TIDEMQ_NAMESERVER_URL": nameserver.url})
    assert result.exit_code == 0, result.output
    assert "brokers" in json.loads(result.stdout)


@pytest.mark.integration
def test_server_error_is_code_and_message_with_its_exit_status(
        runner: CliRunner, nameserver: ServiceProcess) -> None:
    # The nameserver has no /v1/messages/...: it answers {code, message} like any service.
    result = runner.invoke(app, ["--broker", nameserver.url, "query", "--id", "x"], env=WIDE)
    assert result.exit_code == 3  # not found
    assert "NOT_FOUND: no such endpoint" in result.stderr


def test_unreachable_service_is_unavailable_with_exit_5(runner: CliRunner) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    result = runner.invoke(app, ["--nameserver", dead, "cluster"], env=WIDE)
    assert result.exit_code == 5
    assert result.stderr.startswith("UNAVAILABLE: cannot reach")


def test_query_needs_a_valid_combination(runner: CliRunner) -> None:
    result = runner.invoke(app, ["query", "--topic", "t"], env=WIDE)
    assert result.exit_code == 2
    assert "--topic T --key K" in result.stderr


# --- the plan of `tidemq up` (pure) -----------------------------------------------------------

def everything(_: str) -> bool:
    return True


def test_plan_starts_every_service_in_order_with_its_env(tmp_path: Path) -> None:
    opts = UpOptions(data_dir=tmp_path / "d", broker_port=1001, nameserver_port=1002,
                     checker_port=1003, scheduler_port=1004, metrics_port=1005,
                     console_port=1006, flush="sync")
    specs = plan_services(opts, redis_url="redis://127.0.0.1:7/0", token="tok",
                          available=everything)

    assert [s.name for s in specs] == ["nameserver", "broker", "checker", "scheduler", "metrics",
                                       "console"]
    assert [s.module for s in specs] == [f"tidemq_server.{s.name}" for s in specs]
    env = {s.name: dict(s.env) for s in specs}
    data = (tmp_path / "d").resolve()
    assert env["nameserver"] == {"TIDEMQ_NAMESRV_HOST": "127.0.0.1",
                                 "TIDEMQ_NAMESRV_PORT": "1002",
                                 "TIDEMQ_NAMESRV_CLUSTER": "DefaultCluster",
                                 "TIDEMQ_NAMESRV_TOKEN": "tok",
                                 "TIDEMQ_NAMESRV_PEERS": "http://127.0.0.1:1002",
                                 "TIDEMQ_NAMESRV_EXPECT_BROKERS": "broker-a"}
    assert env["broker"] == {
        "TIDEMQ_BROKER_HOST": "127.0.0.1", "TIDEMQ_BROKER_PORT": "1001",
        "TIDEMQ_BROKER_CLUSTER": "DefaultCluster", "TIDEMQ_BROKER_BROKER_NAME": "broker-a",
        "TIDEMQ_BROKER_NAMESERVERS": "http://127.0.0.1:1002",
        "TIDEMQ_BROKER_REDIS_URL": "redis://127.0.0.1:7/0",
        "TIDEMQ_BROKER_DATA_DIR": str(data / "broker"),
        "TIDEMQ_BROKER_TOKEN": "tok", "TIDEMQ_BROKER_FLUSH": "sync",
        "TIDEMQ_BROKER_SCHEDULER_URL": "http://127.0.0.1:1004",
        "TIDEMQ_BROKER_GRPC_PORT": "8081",
    }
    for name, prefix, port in (("checker", "TIDEMQ_CHECKER_", "1003"),
                               ("scheduler", "TIDEMQ_SCHEDULER_", "1004"),
                               ("metrics", "TIDEMQ_METRICS_", "1005")):
        assert env[name][prefix + "BROKER_URL"] == "http://127.0.0.1:1001"
        assert env[name][prefix + "REDIS_URL"] == "redis://127.0.0.1:7/0"
        assert env[name][prefix + "TOKEN"] == "tok"
        assert env[name][prefix + "PORT"] == port
    assert env["scheduler"]["TIDEMQ_SCHEDULER_DATA_DIR"] == str(data / "scheduler")
    assert env["console"] == {
        "TIDEMQ_CONSOLE_HOST": "127.0.0.1", "TIDEMQ_CONSOLE_PORT": "1006",
        "TIDEMQ_CONSOLE_CLUSTER": "DefaultCluster", "TIDEMQ_CONSOLE_TOKEN": "tok",
        "TIDEMQ_CONSOLE_NAMESERVERS": "http://127.0.0.1:1002",
        "TIDEMQ_CONSOLE_CHECKERS": "http://127.0.0.1:1003",
        "TIDEMQ_CONSOLE_SCHEDULERS": "http://127.0.0.1:1004"}
    skipped = plan_services(UpOptions(skip=frozenset({"console"})), redis_url="redis://r",
                            token="t", available=everything)
    assert "console" not in [s.name for s in skipped]
    assert specs[1].health_url == "http://127.0.0.1:1001/healthz"
    assert specs[1].docs_url == "http://127.0.0.1:1001/docs"


def test_plan_skips_absent_modules_and_the_metrics_sidecar_on_request() -> None:
    present = {"tidemq_server.nameserver", "tidemq_server.broker", "tidemq_server.metrics"}
    specs = plan_services(UpOptions(metrics=False), redis_url="redis://r", token="t",
                          available=present.__contains__)
    assert [s.name for s in specs] == ["nameserver", "broker"]
    assert "TIDEMQ_BROKER_SCHEDULER_URL" not in specs[1].env  # no scheduler to ask

    specs = plan_services(UpOptions(skip=frozenset({"broker"})), redis_url="redis://r",
                          token="t", available=present.__contains__)
    assert [s.name for s in specs] == ["nameserver", "metrics"]


def test_plan_fails_without_a_required_service() -> None:
    with pytest.raises(LookupError, match=r"tidemq_server\.broker"):
        plan_services(UpOptions(), redis_url="redis://r", token="t",
                      available=lambda m: m == "tidemq_server.nameserver")


def test_token_and_child_environment() -> None:
    assert resolve_token({"TIDEMQ_TOKEN": "given"}) == "given"
    generated = resolve_token({})
    assert len(generated) == 32 and generated != resolve_token({})

    [ns] = plan_services(UpOptions(skip=frozenset({"broker"}), metrics=False), redis_url="r",
                         token="t", available=lambda m: m == "tidemq_server.nameserver")
    env = child_env(ns, {"PATH": "/bin", "TIDEMQ_NAMESRV_PORT": "1"})
    assert env["PATH"] == "/bin" and env["TIDEMQ_NAMESRV_PORT"] == "9876"
    assert env["PYTHONUNBUFFERED"] == "1"


def test_module_available_needs_a_main_module() -> None:
    assert module_available("tidemq_server.nameserver")
    assert not module_available("tidemq_server.common")  # a package, but no __main__
    assert not module_available("services.no_such_service")


def test_managed_redis_is_append_only_under_the_data_dir(tmp_path: Path) -> None:
    argv = redis_command("/usr/bin/redis-server", 7000, "127.0.0.1", tmp_path)
    assert argv[0] == "/usr/bin/redis-server"
    pairs = dict(zip(argv[1::2], argv[2::2], strict=True))
    assert pairs["--port"] == "7000" and pairs["--dir"] == str(tmp_path)
    assert pairs["--appendonly"] == "yes"


# --- `tidemq up` as a real process (nameserver and managed Redis only) ------------------------

class UpProcess:
    SKIP = ("broker", "checker", "scheduler", "metrics", "console")

    def __init__(self, tmp_path: Path) -> None:
        self.port = free_port()
        self.data_dir = tmp_path / "data"
        self.out = tmp_path / "up.out"
        env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "TIDEMQ_TOKEN")}
        args = ["--nameserver-port", str(self.port), "--data-dir", str(self.data_dir),
                "--stop-timeout", "5"]
        for name in self.SKIP:
            args += ["--skip", name]
        with self.out.open("wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "tidemq_server.cli", "up", *args],
                                         cwd=REPO, env={**env, **NO_WARMUP, **WIDE}, stdout=out,
                                         stderr=subprocess.STDOUT)

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while "tidemq is up" not in self.output():
            assert self.proc.poll() is None, self.output()
            assert time.monotonic() < deadline, self.output()
            time.sleep(0.1)

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def children(self) -> dict[str, psutil.Process]:
        found = {}
        for child in psutil.Process(self.proc.pid).children():
            cmdline = " ".join(child.cmdline())
            found["redis" if "redis-server" in cmdline else "nameserver"] = child
        return found

    def wait(self, timeout_s: float = 20.0) -> int:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


@pytest.mark.integration
def test_up_starts_redis_and_nameserver_and_stops_on_sigterm(tmp_path: Path) -> None:
    up = UpProcess(tmp_path)
    try:
        up.wait_ready()
        assert httpx.get(f"http://127.0.0.1:{up.port}/healthz").json() == {"status": "ok"}
        children = up.children()
        assert set(children) == {"redis", "nameserver"}
        assert (up.data_dir / "redis").is_dir()
        assert (up.data_dir / "logs" / "nameserver.log").is_file()
        output = up.output()
        assert f"http://127.0.0.1:{up.port}/docs" in output and "cluster token" in output

        up.proc.send_signal(signal.SIGTERM)
        assert up.wait() == 0, up.output()
        output = up.output()
        assert output.index("stopped nameserver") < output.index("stopped redis")
        assert not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE
                       for c in children.values())
    finally:
        if up.proc.poll() is None:
            up.proc.kill()


@pytest.mark.integration
def test_up_restarts_a_child_that_dies(tmp_path: Path) -> None:
    up = UpProcess(tmp_path)
    try:
        up.wait_ready()
        children = up.children()
        children["nameserver"].kill()

        deadline = time.monotonic() + 30
        while "nameserver ready again" not in up.output():
            assert up.proc.poll() is None, up.output()  # `tidemq up` keeps running
            assert time.monotonic() < deadline, up.output()
            time.sleep(0.1)
        assert "nameserver exited by SIGKILL; restarted (1st time)" in up.output()
        assert httpx.get(f"http://127.0.0.1:{up.port}/healthz").status_code == 200
        after = up.children()
        assert after["nameserver"].pid != children["nameserver"].pid
        assert after["redis"].pid == children["redis"].pid  # the rest kept running

        up.proc.send_signal(signal.SIGTERM)
        assert up.wait() == 0, up.output()
        assert "stopped redis cleanly" in up.output()
    finally:
        if up.proc.poll() is None:
            up.proc.kill()


# --- the client commands against a whole local cluster -----------------------------------------

@pytest.mark.integration
def test_client_commands_against_tidemq_up(tmp_path: Path, runner: CliRunner) -> None:
    ns_port, broker_port = free_port(), free_port()
    out = tmp_path / "up.out"
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tidemq_server.cli", "up", "--nameserver-port", str(ns_port),
             "--broker-port", str(broker_port), "--data-dir", str(tmp_path / "data"),
             "--skip", "checker", "--skip", "scheduler", "--no-metrics"],
            cwd=REPO, env={**env, **NO_WARMUP, **WIDE}, stdout=sink, stderr=subprocess.STDOUT)
    urls = ["--broker", f"http://127.0.0.1:{broker_port}",
            "--nameserver", f"http://127.0.0.1:{ns_port}"]
    try:
        deadline = time.monotonic() + 60
        while "tidemq is up" not in out.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.1)

        def cli(*args: str) -> str:
            result = runner.invoke(app, [*urls, *args], env=WIDE)
            assert result.exit_code == 0, result.output
            return result.stdout

        cli("topic", "create", "cli-e2e", "--queues", "2")
        assert "cli-e2e" in cli("topic", "list")
        deadline = time.monotonic() + 10
        while "cli-e2e" not in cli("cluster"):  # registered with the nameserver at creation
            assert time.monotonic() < deadline
            time.sleep(0.2)

        sent = json.loads(cli("send", "cli-e2e", "hello", "--tag", "TagA", "--key", "k-1",
                              "--json"))
        cli("send", "cli-e2e", "bulk {i}", "--count", "10", "--batch", "4")
        lines = cli("consume", "cli-e2e", "--json").splitlines()
        bodies = sorted(json.loads(line)["body"] for line in lines)
        assert bodies == sorted(["hello", *(f"bulk {i}" for i in range(10))])
        assert len(cli("consume", "cli-e2e", "--max", "3", "--json").splitlines()) == 3

        by_key = [json.loads(line) for line in
                  cli("query", "--topic", "cli-e2e", "--key", "k-1", "--json").splitlines()]
        assert [m["message_id"] for m in by_key] == [sent["message_id"]]
        by_id = json.loads(cli("query", "--id", sent["message_id"], "--json"))
        assert by_id["body"] == "hello"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(30) == 0, out.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
