"""A real etcd (Debian's ``etcd-server``) on free ports with a temp data dir, for tests."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import httpx

from tests.support.procs import PROBE_TIMEOUT_S, START_TIMEOUT_S, free_port, stop_process


class EtcdServer:
    """One etcd member; ``url`` is its client endpoint (the v3 JSON gateway lives there)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / f"etcd-{self.port}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = START_TIMEOUT_S) -> EtcdServer:
        exe = shutil.which("etcd") or "/usr/bin/etcd"
        if not Path(exe).exists():
            raise RuntimeError("etcd is not installed: run scripts/install-system-deps.sh")
        self.workdir.mkdir(parents=True, exist_ok=True)
        peer = f"http://127.0.0.1:{self.peer_port}"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [exe, "--name", "test", "--data-dir", str(self.workdir / f"data-{self.port}"),
                 "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"test={peer}", "--heartbeat-interval", "50",
                 "--election-timeout", "500", "--log-level", "warn"],
                stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}:\n"
                                   + self.log_path.read_text()[-3000:])
            try:
                health = httpx.get(self.url + "/health", timeout=PROBE_TIMEOUT_S).json()
                if health.get("health") == "true":
                    return self
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.05)
        self.stop()
        raise TimeoutError("etcd not healthy:\n" + self.log_path.read_text()[-3000:])

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None
