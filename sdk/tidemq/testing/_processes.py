"""Child processes of a test system: redis-server and the tidemq services, each on a free port.

Every process writes its log to a file in the system's directory; a process that exits or
does not become healthy in time fails with the tail of that log, so a broken service is
readable from the test output.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

START_TIMEOUT_S = 60.0  # a service must answer /healthz within this (a loaded CI box is slow)
STOP_TIMEOUT_S = 15.0  # SIGTERM, then SIGKILL after this
LOG_TAIL_CHARS = 4000  # of a failed process's log, shown in the error


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Child:
    """One child process with its log file."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.command = command
        self.env = env
        self.log_path = log
        self.proc: subprocess.Popen[bytes] | None = None

    def spawn(self) -> None:
        with self.log_path.open("ab") as out:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(self.command, env={**os.environ, **self.env},
                                         stdout=out, stderr=subprocess.STDOUT)

    def failed(self, why: str) -> RuntimeError:
        tail = self.log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:] \
            if self.log_path.exists() else ""
        return RuntimeError(f"tidemq test system: {self.name} {why}; its log "
                            f"({self.log_path}):\n{tail}")

    def wait_healthy(self, url: str, timeout_s: float = START_TIMEOUT_S) -> None:
        """Poll ``url`` until it answers 200 (or the port accepts, for ``url`` ``tcp://``)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise self.failed(f"exited with {self.proc.returncode}")
            if _answers(url):
                return
            time.sleep(0.05)
        self.stop(signal.SIGKILL)
        raise self.failed(f"not ready after {timeout_s:.0f}s")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _answers(url: str) -> bool:
    if url.startswith("tcp://"):
        host, port = url[len("tcp://"):].rsplit(":", 1)
        try:
            with socket.create_connection((host, int(port)), timeout=0.2):
                return True
        except OSError:
            return False
    try:
        return httpx.get(url, timeout=0.5).status_code == 200
    except httpx.HTTPError:
        return False


def redis_child(workdir: Path, port: int) -> Child:
    """A managed redis-server (Debian's ``redis-server`` must be on PATH)."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("tidemq test system: redis-server is not installed (Debian: "
                           "apt-get install redis-server), or pass redis_url= to use a running "
                           "Redis")
    data = workdir / "redis"
    data.mkdir(parents=True, exist_ok=True)
    return Child("redis-server", [exe, "--port", str(port), "--bind", "127.0.0.1", "--dir",
                                  str(data), "--save", "", "--appendonly", "no",
                                  "--protected-mode", "no"], {}, workdir / "redis.log")


def service_child(name: str, workdir: Path, env: dict[str, str]) -> Child:
    """``python -m tidemq_server.<name>`` with ``env`` (needs ``tidemq[server]``)."""
    return Child(name, [sys.executable, "-m", f"tidemq_server.{name}"],
                 {**env, "PYTHONUNBUFFERED": "1"}, workdir / f"{name}.log")
