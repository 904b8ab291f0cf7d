"""A real tidemq for the official RocketMQ 5 client, and that client in its own virtualenv.

``rmq_python``: the interpreter of a virtualenv holding ``rocketmq-python-client`` (the same
version as tidemq's own environment), created once at ``/tmp/tidemq-rmq-venv`` (or
``$TIDEMQ_RMQ_VENV``) and reused by later runs. The client installs a top-level ``rocketmq``
module, so it never shares tidemq's environment.

``cluster``: redis-server (the session's), a nameserver, a broker serving gRPC on a free port,
and the checker and scheduler when they exist, all with short intervals; one per session,
every test uses its own topics and groups. ``cluster.client`` runs a scenario of
``rmq_client.py`` in that virtualenv with ``HOME`` in a temp dir (the client logs under
``$HOME/logs``) and returns its JSON answer.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.broker import TOKEN, unique
from tests.support.procs import RedisServer, ServiceProcess, free_port, wait_port

RMQ_VENV = Path(os.environ.get("TIDEMQ_RMQ_VENV", "/tmp/tidemq-rmq-venv"))
CLIENT_PACKAGE = "rocketmq-python-client"
SCRIPT = Path(__file__).with_name("rmq_client.py")

#: Fast checker and scheduler for tests (``TIDEMQ_CHECKER_*`` / ``TIDEMQ_SCHEDULER_*``).
CHECKER_ENV = {"CHECK_INTERVAL_MS": "1000", "TRANSACTION_TIMEOUT_MS": "1000"}
SCHEDULER_ENV: dict[str, str] = {}
MAX_RECONSUME_TIMES = 3  # the broker's delivery limit in these tests (4 deliveries, then DLQ)


def _client_version() -> str:
    try:
        return importlib.metadata.version(CLIENT_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return ""


def _works(python: Path, version: str) -> bool:
    if not python.exists():
        return False
    probe = ("import importlib.metadata as m, rocketmq; "
             f"print(m.version({CLIENT_PACKAGE!r}))")
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "HOME": "/tmp"})
    return done.returncode == 0 and (not version or done.stdout.strip() == version)


@pytest.fixture(scope="session")
def rmq_python() -> Path:
    # pytest-xdist workers (and other checkouts' test runs) share RMQ_VENV: one builds it while
    # the others wait, then find it working; nobody replaces it under a worker that uses it.
    lock = RMQ_VENV.with_name(f"{RMQ_VENV.name}.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            return _build_rmq_venv()
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


def _build_rmq_venv() -> Path:
    version = _client_version()
    python = RMQ_VENV / "bin" / "python"
    if _works(python, version):
        return python
    build = RMQ_VENV.with_name(f"{RMQ_VENV.name}.build-{os.getpid()}")
    shutil.rmtree(build, ignore_errors=True)
    requirement = f"{CLIENT_PACKAGE}=={version}" if version else CLIENT_PACKAGE
    try:
        subprocess.run([sys.executable, "-m", "venv", str(build)], check=True, timeout=120)
        subprocess.run([str(build / "bin" / "python"), "-m", "pip", "install", "-q",
                        requirement], check=True, timeout=600)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        shutil.rmtree(build, ignore_errors=True)
        pytest.skip(f"cannot build the {CLIENT_PACKAGE} virtualenv at {build}: {exc}")
    shutil.rmtree(RMQ_VENV, ignore_errors=True)
    build.rename(RMQ_VENV)  # bin/python and site-packages work from the new place
    assert _works(python, version), f"{RMQ_VENV} was built but cannot import rocketmq"
    return python


@dataclass
class Cluster:
    broker_url: str
    nameserver_url: str
    grpc_endpoint: str
    python: Path
    home: Path
    procs: dict[str, ServiceProcess] = field(default_factory=dict)
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30.0))

    def topic(self, queues: int = 4) -> str:
        name = unique("G")
        resp = self.http.put(f"{self.broker_url}/v1/topics/{name}", json={"queues": queues})
        assert resp.status_code == 200, resp.text
        return name

    def client(self, scenario: str, *args: str | int, timeout: float = 60.0) -> dict[str, Any]:
        """Run one scenario with the official client; its JSON answer."""
        proc = self.start_client(scenario, *args)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"client {scenario} timed out after {timeout}s:\n{err[-3000:]}"
                                 ) from None
        return self.answer(scenario, proc.returncode, out, err)

    def start_client(self, scenario: str, *args: str | int) -> subprocess.Popen[str]:
        env = {**os.environ, "HOME": str(self.home), "PYTHONUNBUFFERED": "1"}
        env.pop("PYTHONPATH", None)
        return subprocess.Popen([str(self.python), str(SCRIPT), self.grpc_endpoint, scenario,
                                 *map(str, args)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=str(self.home))

    @staticmethod
    def answer(scenario: str, code: int | None, out: str, err: str) -> dict[str, Any]:
        lines = [line for line in out.splitlines() if line.strip()]
        assert code == 0 and lines, f"client {scenario} failed ({code}):\n{err[-3000:]}"
        result: dict[str, Any] = json.loads(lines[-1])
        return result

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{p.logs()[-3000:]}" for name, p in self.procs.items())


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer,
            rmq_python: Path) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("grpc")
    home = work / "home"
    home.mkdir()
    name = unique("cluster")
    ns_port, broker_port, grpc_port = free_port(), free_port(), free_port()
    procs: dict[str, ServiceProcess] = {}
    try:
        procs["nameserver"] = ServiceProcess("nameserver", ns_port, {
            "TIDEMQ_NAMESRV_PORT": str(ns_port)}, work).start()
        ns_url = procs["nameserver"].url
        sidecars = ["checker", "scheduler"]
        ports = {n: free_port() for n in sidecars}
        broker_env = {
            "TIDEMQ_BROKER_PORT": str(broker_port), "TIDEMQ_BROKER_GRPC_PORT": str(grpc_port),
            "TIDEMQ_BROKER_DATA_DIR": str(work / "broker"), "TIDEMQ_BROKER_CLUSTER": name,
            "TIDEMQ_BROKER_REDIS_URL": redis_server.url, "TIDEMQ_BROKER_TOKEN": TOKEN,
            "TIDEMQ_BROKER_NAMESERVERS": ns_url, "TIDEMQ_BROKER_FLUSH_INTERVAL_MS": "50",
            "TIDEMQ_BROKER_SEGMENT_BYTES": str(64 * 1024 * 1024),
            "TIDEMQ_BROKER_MAX_RECONSUME_TIMES": str(MAX_RECONSUME_TIMES),
        }
        if "scheduler" in sidecars:
            broker_env["TIDEMQ_BROKER_SCHEDULER_URL"] = f"http://127.0.0.1:{ports['scheduler']}"
        procs["broker"] = ServiceProcess("broker", broker_port, broker_env, work).start()
        wait_port(grpc_port)
        for sidecar, extra in (("checker", CHECKER_ENV), ("scheduler", SCHEDULER_ENV)):
            if sidecar not in sidecars:
                continue
            prefix = f"TIDEMQ_{sidecar.upper()}_"
            env = {f"{prefix}{k}": v for k, v in {
                "PORT": str(ports[sidecar]), "CLUSTER": name, "TOKEN": TOKEN,
                "BROKER_URL": procs["broker"].url, "REDIS_URL": redis_server.url,
                "DATA_DIR": str(work / sidecar), **extra}.items()}
            procs[sidecar] = ServiceProcess(sidecar, ports[sidecar], env, work).start()
        yield Cluster(broker_url=procs["broker"].url, nameserver_url=ns_url,
                      grpc_endpoint=f"127.0.0.1:{grpc_port}", python=rmq_python, home=home,
                      procs=procs)
    finally:
        for proc in reversed(procs.values()):
            proc.stop()
