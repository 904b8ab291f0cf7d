"""`tidemq up` as a real process group: graceful stop under repeated signals, the gRPC port it
prints, the cluster token kept in the data dir, and `make up UP_ARGS=...`."""

from __future__ import annotations

import os
import re
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.support.procs import REPO, free_port
from tests.support.up import UpRun
from tidemq_server.broker.store.checkpoint import Checkpoint
from tidemq_server.cli.up import DUPLICATE_SIGNAL_S, Supervisor

pytestmark = pytest.mark.integration

class Up(UpRun):
    """`tidemq up` started in its own process group, as `make up` runs it."""

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        self.wait_for("tidemq is up", timeout_s)
        self.wait_for("cluster token", timeout_s)  # the token line follows the endpoints table

    def stop_group(self, times: int = 1) -> int:
        """SIGTERM the group ``times`` times. A repeat is sent once the stop has begun (two
        signals sent together may merge into one), as `make` forwards the group's SIGTERM."""
        os.killpg(self.proc.pid, signal.SIGTERM)
        for _ in range(times - 1):
            deadline = time.monotonic() + 10
            while "stopping" not in self.output() and time.monotonic() < deadline:
                time.sleep(0.01)
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def token(self) -> str:
        found = re.search(r"cluster token (\S+)", self.output())
        assert found, self.output()
        return found.group(1)


def test_two_sigterms_to_the_group_still_stop_every_child_gracefully(tmp_path: Path) -> None:
    ns_port, broker_port, grpc_port = free_port(), free_port(), free_port()
    up = Up(tmp_path, "--nameserver-port", str(ns_port), "--broker-port", str(broker_port),
            "--grpc-port", str(grpc_port), "--skip", "checker", "--skip", "scheduler",
            "--skip", "console", "--no-metrics", "--stop-timeout", "20")
    try:
        up.wait_ready()
        # the endpoints table shows the gRPC port the broker really listens on
        assert f"http://127.0.0.1:{broker_port} grpc:{grpc_port}" in up.output()
        socket.create_connection(("127.0.0.1", grpc_port), timeout=2).close()
        topic = httpx.put(f"http://127.0.0.1:{broker_port}/v1/topics/stop-check",
                          json={"queues": 1})
        assert topic.status_code == 200, topic.text

        assert up.stop_group(times=2) == 0, up.output()
    finally:
        up.kill()
    output = up.output()
    assert "did not stop in time" not in output and "SIGKILL" not in output, output
    for child in ("broker", "nameserver", "redis"):
        assert f"stopped {child} cleanly" in output, output
    assert output.index("stopped broker") < output.index("stopped nameserver")
    broker_log = (up.data_dir / "logs" / "broker.log").read_text(errors="replace")
    assert re.search(r"broker \S+ stopped", broker_log), broker_log[-3000:]
    assert "Application shutdown complete" in broker_log
    # the store was closed, not killed: its last checkpoint records a clean shutdown
    assert Checkpoint.load(up.data_dir / "broker" / "store" / "checkpoint").clean_shutdown


def test_the_cluster_token_is_kept_in_the_data_dir(tmp_path: Path) -> None:
    args = ["--nameserver-port", str(free_port()), "--skip", "broker", "--skip", "checker",
            "--skip", "scheduler", "--skip", "console", "--no-metrics"]
    first = Up(tmp_path, *args)
    try:
        first.wait_ready()
        assert first.stop_group() == 0, first.output()
    finally:
        first.kill()
    token_file = first.data_dir / "token"
    assert token_file.read_text().strip() == first.token()
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600

    second = Up(tmp_path, *args)
    try:
        second.wait_ready()
        assert second.token() == first.token()  # the same token on the next `make up`
        assert second.stop_group() == 0, second.output()
    finally:
        second.kill()

    chosen = Up(tmp_path, *args, env={"TIDEMQ_TOKEN": "chosen-token"})
    try:
        chosen.wait_ready()
        assert chosen.token() == "chosen-token" and "from TIDEMQ_TOKEN" in chosen.output()
        assert chosen.stop_group() == 0, chosen.output()
    finally:
        chosen.kill()
    assert token_file.read_text().strip() == first.token()  # TIDEMQ_TOKEN does not overwrite it


def test_make_up_passes_up_args_through() -> None:
    dry = subprocess.run(["make", "-n", "up", "UP_ARGS=--grpc-port 18081 --no-metrics"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert re.search(r"tidemq up --grpc-port 18081 --no-metrics$", dry.stdout, re.M), dry.stdout


def test_only_a_later_ctrl_c_skips_the_graceful_wait(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path, start_timeout_s=1, stop_timeout_s=1)
    for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGINT, signal.SIGTERM):
        sup._on_signal(sig, None)  # a burst: the first signal, make's forward, a quick Ctrl-C
    assert sup.stop_requested and not sup.force
    assert sup._first_signal_at is not None
    sup._first_signal_at -= DUPLICATE_SIGNAL_S
    sup._on_signal(signal.SIGTERM, None)  # another supervisor's SIGTERM never kills
    assert not sup.force
    sup._on_signal(signal.SIGINT, None)  # Ctrl-C pressed again, later: kill what is left
    assert sup.force
