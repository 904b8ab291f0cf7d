"""`tidemq up` as a real process group for tests: wait for it, read its output, find and kill
its children, stop it as `make up` does."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.support.procs import REPO, free_port

WIDE = {"COLUMNS": "200"}  # rich tables must not truncate what the tests look for
NO_WARMUP = {"TIDEMQ_NAMESRV_WARMUP_S": "0"}  # nameservers answer 404 for unknown topics at once


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_base(count: int, step: int) -> int:
    """A free port p with p + step*i free too for every i < count (a base port of `up`)."""
    for _ in range(200):
        base = free_port()
        if base + step * (count - 1) <= 65535 and all(port_free(base + step * i)
                                                     for i in range(count)):
            return base
    raise RuntimeError(f"no base port with {count} free ports {step} apart")


class UpRun:
    """`tidemq up` started in its own process group with ``args``; output in a file. ``cwd``:
    where it is started (the repository by default)."""

    def __init__(self, tmp_path: Path, *args: str, env: dict[str, str] | None = None,
                 cwd: Path = REPO) -> None:
        self.data_dir = tmp_path / "data"
        self.out = tmp_path / f"up-{time.monotonic_ns()}.out"
        base = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "TIDEMQ_TOKEN")}
        with self.out.open("wb") as sink:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tidemq_server.cli", "up", "--data-dir", str(self.data_dir),
                 "--console-port", str(free_port()),  # never 8080: tests run side by side
                 *args], cwd=cwd, env={**base, **NO_WARMUP, **WIDE, **(env or {})}, stdout=sink,
                stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def wait_for(self, text: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.output():
            assert self.proc.poll() is None, self.output()
            assert time.monotonic() < deadline, f"no {text!r} in:\n{self.output()}"
            time.sleep(0.1)

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        self.wait_for("tidemq is up", timeout_s)

    def children(self) -> dict[str, psutil.Process]:
        """Running children by service: ``redis`` or the ``tidemq_server.<x>`` module's ``x``
        (several of one kind: the last one found)."""
        found = {}
        for child in psutil.Process(self.proc.pid).children():
            try:
                cmdline = child.cmdline()
            except psutil.NoSuchProcess:
                continue
            if any("redis-server" in part for part in cmdline):
                found["redis"] = child
            elif "-m" in cmdline:
                module = cmdline[cmdline.index("-m") + 1]
                found[module.removeprefix("tidemq_server.")] = child
        return found

    def child_env(self, child: psutil.Process) -> dict[str, str]:
        return dict(child.environ())

    def stop(self, timeout_s: float = 60.0) -> int:
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
