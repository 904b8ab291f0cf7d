"""docker-compose.yml as local processes: each service's command and environment, on loopback.

No Docker engine runs here, so the compose file is read and every service that is a process we
can run (Redis and the tidemq services) is started as a child: service names resolve to
127.0.0.1, each port a service ``expose``s is remapped to a free one (in URLs and in the
service's own ``*_PORT``), ``0.0.0.0`` binds become ``127.0.0.1`` and ``/data/...`` and
``/secrets`` paths move under a temp directory. A one-shot service (no ``expose``,
``restart: "no"``: the init step making the TLS files) is run to completion first. Services
serving TLS are reached over https://, verified against the CA the init step made. Images that
are not ours (Prometheus, Grafana) are not started.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support.procs import REPO, free_port, wait_port
from tidemq_server.common.auth.client import SigningAuth

COMPOSE = REPO / "docker-compose.yml"


def load_compose(path: Path = COMPOSE) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def env_of(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment with ``${VAR:-default}`` resolved to the default."""
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) for item in raw)
    return {k: re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", str(v)) for k, v in raw.items()}


@dataclass
class LocalService:
    name: str
    argv: list[str]
    env: dict[str, str]
    port: int  # the remapped port of its first `expose`
    health: str  # "redis" or an HTTP URL
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    def logs(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-6000:]


@dataclass
class Topology:
    compose: dict[str, Any]
    workdir: Path
    ports: dict[tuple[str, int], int] = field(default_factory=dict)
    # the host port a service publishes (its default) → the port that service runs on here
    published: dict[int, int] = field(default_factory=dict)
    services: dict[str, LocalService] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, svc in self.compose["services"].items():
            for port in svc.get("expose", []):
                self.ports[(name, int(port))] = free_port()
        for name, svc in self.compose["services"].items():
            for spec in svc.get("ports", []):  # 127.0.0.1:${VARIABLE:-HOST}:CONTAINER
                host, inner = re.findall(r"(\d+)\}?:(\d+)$", str(spec))[0]
                if (name, int(inner)) in self.ports:
                    self.published[int(host)] = self.ports[(name, int(inner))]

    def tls(self, service: str) -> bool:
        """The service serves TLS: its environment names a certificate."""
        env = env_of(self.compose["services"][service])
        return any(k.endswith("_TLS_CERT") and v for k, v in env.items())

    @property
    def ca(self) -> Path:
        """Where the init step's CA lands here (``/secrets/ca.pem`` in compose)."""
        return Path(self.localize("", "/secrets/ca.pem"))

    def admin_auth(self) -> SigningAuth | None:
        """The admin account the init step made (``/secrets/admin.env``), signing requests;
        None when accounts are off (no such file)."""
        path = Path(self.localize("", "/secrets/admin.env"))
        if not path.exists():
            return None
        pairs = dict(line.split("=", 1) for line in path.read_text().splitlines()
                     if "=" in line and not line.startswith("#"))
        return SigningAuth(pairs["TIDEMQ_ACCESS_KEY"], pairs["TIDEMQ_SECRET_KEY"])

    def client(self, service: str) -> httpx.Client:
        """A client of ``service`` as the admin: verifying its certificate, signing requests."""
        return httpx.Client(base_url=self.url(service), timeout=10, verify=self.verify(),
                            auth=self.admin_auth())

    def verify(self) -> ssl.SSLContext | bool:
        return ssl.create_default_context(cafile=str(self.ca)) if self.ca.exists() else True

    def url(self, service: str) -> str:
        port = next(p for (name, _), p in self.ports.items() if name == service)
        return f"{'https' if self.tls(service) else 'http'}://127.0.0.1:{port}"

    def run_once(self, name: str, timeout_s: float = 60.0) -> None:
        """Run a one-shot compose service (``python -m ...``) to completion; fail on an error."""
        svc = self.compose["services"][name]
        command = [self.localize(name, str(c)) for c in svc["command"]]
        assert command[:2] == ["python", "-m"], command
        env = {k: self.localize(name, v) for k, v in env_of(svc).items()}
        done = subprocess.run([sys.executable, *command[1:]], cwd=REPO, capture_output=True,
                              text=True, timeout=timeout_s, env={**os.environ, **env})
        assert done.returncode == 0, f"{name} failed:\n{done.stdout}{done.stderr}"

    def localize(self, service: str, value: str) -> str:
        for host, local in self.published.items():  # the advertised addresses, for the host
            value = re.sub(rf"\b127\.0\.0\.1:{host}\b", f"127.0.0.1:{local}", value)
        for (name, port), local in self.ports.items():
            value = re.sub(rf"(?<![\w.-]){re.escape(name)}:{port}\b", f"127.0.0.1:{local}",
                           value)
            if name == service and value == str(port):
                value = str(local)
        if value == "0.0.0.0":
            value = "127.0.0.1"
        if value.startswith("/data/"):
            value = str(self.workdir / "data" / value.removeprefix("/data/"))
        if value == "/secrets" or value.startswith("/secrets/"):
            value = str(self.workdir / value.lstrip("/"))
        return value

    def plan(self, name: str) -> LocalService | None:
        """How to run one compose service here; None for images we do not run."""
        svc = self.compose["services"][name]
        command = [str(c) for c in svc.get("command") or []]
        exposed = [int(p) for p in svc.get("expose", [])]
        if not command or not exposed:
            return None
        port = self.ports[(name, exposed[0])]
        env = {k: self.localize(name, v) for k, v in env_of(svc).items()}
        if command[0] == "redis-server":
            exe = shutil.which("redis-server")
            assert exe, "redis-server is not installed"
            data = self.workdir / "data" / name
            argv = [exe, *command[1:], "--port", str(port), "--bind", "127.0.0.1",
                    "--protected-mode", "no"]
            argv[argv.index("--dir") + 1] = str(data)
            return LocalService(name, argv, env, port, "redis")
        if command[:2] == ["python", "-m"]:
            return LocalService(name, [sys.executable, *command[1:]], env, port,
                                f"{self.url(name)}/healthz")
        return None

    def start(self, name: str, timeout_s: float = 60.0) -> LocalService:
        service = self.plan(name)
        assert service is not None, f"{name} cannot run as a local process"
        (self.workdir / "data" / name).mkdir(parents=True, exist_ok=True)
        service.log_path = self.workdir / f"{name}.log"
        with open(service.log_path, "ab") as log:
            service.proc = subprocess.Popen(
                service.argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, **service.env, "PYTHONUNBUFFERED": "1"})
        self.services[name] = service
        deadline = time.monotonic() + timeout_s
        if service.health == "redis":
            wait_port(service.port, timeout_s)
            return service
        while time.monotonic() < deadline:
            if service.proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {service.proc.returncode}:\n"
                                   + service.logs())
            try:
                if httpx.get(service.health, timeout=1.0,
                             verify=self.verify()).status_code == 200:
                    return service
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{name} not healthy after {timeout_s}s:\n{service.logs()}")

    def stop_all(self) -> None:
        for service in reversed(list(self.services.values())):
            proc = service.proc
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
