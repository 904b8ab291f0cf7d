"""Start real processes on loopback for tests: redis-server and tidemq services.

Each process gets a free port and its own temp directory; logs go to a file that is printed
when a test fails to start it, so a broken service is readable from the test output.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
# How long a process may take to start and answer its health check. Only a start is waited for,
# so a broken one is the only thing that waits this out; a healthy start on a loaded 2-core
# machine (six test runs at once, load 25-37) took more than 20 s (s).
START_TIMEOUT_S = 90.0
PROBE_TIMEOUT_S = 5.0  # one health probe: a loaded service answers late, not never (s)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=PROBE_TIMEOUT_S):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


def stop_process(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM) -> None:
    """Send ``sig`` to a running child and reap it; SIGKILL if it lingers past 10 s."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class RedisServer:
    """A real redis-server on a free port (appendonly so restarts keep data)."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed: run scripts/install-system-deps.sh")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir),
             "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
             "--protected-mode", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_port(self.port)
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        stop_process(self.proc, sig)
        self.proc = None


class ServiceProcess:
    """``python -m tidemq_server.<name>`` as a child process with the given environment."""

    def __init__(self, name: str, port: int, env: dict[str, str], workdir: Path) -> None:
        self.name = name
        self.port = port
        self.env = env
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / f"{name}-{port}.log"

    @property
    def tls(self) -> bool:
        """Serves HTTPS: its environment names a certificate (``TIDEMQ_<SERVICE>_TLS_CERT``)."""
        return any(k.endswith("_TLS_CERT") and v for k, v in self.env.items())

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def verify(self) -> ssl.SSLContext | bool:
        """What a client of this service verifies against: the CA of ``TIDEMQ_TLS_CA`` in its
        environment when it serves TLS (else the default store)."""
        ca = self.env.get("TIDEMQ_TLS_CA")
        return ssl.create_default_context(cafile=ca) if self.tls and ca else True

    def start(self, timeout: float = START_TIMEOUT_S, *, wait: bool = True) -> ServiceProcess:
        """Start the service and wait until it answers /healthz; ``wait=False`` returns once
        the process is spawned (a test that must learn of its readiness another way)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        if self.name == "broker":  # gRPC off unless a test asks: brokers must not race for 8081
            env.setdefault("TIDEMQ_BROKER_GRPC_PORT", "0")
        if self.name == "nameserver":  # unknown topics are 404 at once unless a test asks
            env.setdefault("TIDEMQ_NAMESRV_WARMUP_S", "0")
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen([sys.executable, "-m", f"tidemq_server.{self.name}"],
                                         cwd=REPO, env=env, stdout=log, stderr=log)
        if not wait:
            return self
        deadline = time.monotonic() + timeout
        verify = self.verify()
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n"
                                   + self.log_path.read_text()[-4000:])
            try:
                if httpx.get(self.url + "/healthz", timeout=PROBE_TIMEOUT_S,
                             verify=verify).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop(signal.SIGKILL)
        raise TimeoutError(f"{self.name} not healthy after {timeout}s:\n"
                           + self.log_path.read_text()[-4000:])

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        code = self.proc.returncode
        self.proc = None
        return code

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def logs(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""
