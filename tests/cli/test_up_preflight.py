"""A second `tidemq up` never touches a running one (real `tidemq up` processes).

Before, it started another redis-server on the live ``<data-dir>/redis`` (opening the running
system's AOF) and only then found the nameserver port taken. Now it locks the data dir and
checks every port it will use before starting anything: one line names the running instance
(its pid) or the taken port and the option that moves it, the exit status is non-zero, and no
redis-server was started.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.procs import free_port
from tests.support.up import UpRun
from tidemq_server.cli.preflight import DataDirLock

pytestmark = pytest.mark.integration

LIGHT = ("--skip", "broker", "--skip", "checker", "--skip", "scheduler", "--skip", "console",
         "--no-metrics")  # Redis and a nameserver: enough to hold a data dir


def _refused(up: UpRun, timeout_s: float = 30.0) -> str:
    """The output of ``up``, which must exit non-zero on its own, soon."""
    try:
        code = up.proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        up.kill()
        raise AssertionError(f"the second tidemq up kept running:\n{up.output()}") from None
    assert code != 0, up.output()
    return up.output()


def _redis_starts(data_dir: Path) -> int:
    log = data_dir / "logs" / "redis.log"
    return log.read_text(errors="replace").count("redis starting") if log.exists() else 0


@pytest.fixture
def listening() -> Iterator[int]:
    """A port some other program listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_a_second_up_on_the_same_data_dir_names_the_first_and_starts_nothing(
        tmp_path: Path) -> None:
    ns_port = free_port()
    first = UpRun(tmp_path, "--nameserver-port", str(ns_port), *LIGHT)
    try:
        first.wait_ready()
        assert _redis_starts(first.data_dir) == 1
        second = UpRun(tmp_path, "--nameserver-port", str(free_port()), *LIGHT)
        out = _refused(second)
        assert f"another tidemq up (pid {first.proc.pid}) is running" in out, out
        assert str(first.data_dir.resolve()) in out.replace("\n", "")
        assert "Traceback" not in out
        assert _redis_starts(first.data_dir) == 1  # the live Redis files were left alone
        assert httpx.get(f"http://127.0.0.1:{ns_port}/healthz").status_code == 200
    finally:
        first.stop()
    lock = DataDirLock(first.data_dir)  # released with the first one
    lock.acquire()
    lock.release()


@pytest.mark.parametrize("option", ["--nameserver-port", "--console-port"])
def test_a_taken_port_is_named_before_anything_starts(tmp_path: Path, listening: int,
                                                      option: str) -> None:
    # the console starts last: before, Redis, the nameserver and the broker ran first
    rest = LIGHT if option == "--nameserver-port" else (
        "--nameserver-port", str(free_port()), "--broker-port", str(free_port()),
        "--grpc-port", "0", "--skip", "checker", "--skip", "scheduler", "--no-metrics")
    up = UpRun(tmp_path, *rest, option, str(listening))
    out = _refused(up)
    assert f"port {listening} on 127.0.0.1 is in use" in out and option in out, out
    assert _redis_starts(up.data_dir) == 0 and not (up.data_dir / "redis").exists(), out
    assert "ready at" not in out  # no service was started either
