"""The official RocketMQ 5 Python client over TLS to the broker's gRPC door.

A broker serving HTTPS and TLS gRPC with a development CA's certificate; the official client
(``tls_enable=True``, trusting the CA through grpc's ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``) sends
and receives. The same client without the CA, and a plain-text client, get nothing through.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.broker.grpc.conftest import SCRIPT
from tests.support.broker import TOKEN, unique
from tests.support.procs import RedisServer, ServiceProcess, free_port, wait_port
from tidemq_server.cli.certs import DevPki, ensure_dev_pki

pytestmark = pytest.mark.integration


@dataclass
class TlsBroker:
    pki: DevPki
    proc: ServiceProcess
    endpoint: str  # host:port of the TLS gRPC door
    python: Path
    home: Path

    def topic(self) -> str:
        name = unique("TLS")
        resp = httpx.put(f"{self.proc.url}/v1/topics/{name}", json={"queues": 2}, timeout=10,
                         verify=ssl.create_default_context(cafile=str(self.pki.ca)))
        assert resp.status_code == 200, resp.text
        return name

    def run(self, *args: str, tls: bool = True, ca: bool = True,
            timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "HOME": str(self.home), "PYTHONUNBUFFERED": "1",
               "RMQ_TLS": "1" if tls else "0"}
        env.pop("PYTHONPATH", None)
        env.pop("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", None)
        if ca:
            env["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = str(self.pki.ca)
        return subprocess.run([str(self.python), str(SCRIPT), self.endpoint, *args], env=env,
                              capture_output=True, text=True, timeout=timeout,
                              cwd=str(self.home))


def answer(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert done.returncode == 0 and lines, f"client failed ({done.returncode}):\n" \
                                           f"{done.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(lines[-1])
    return result


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer,
           rmq_python: Path) -> Iterator[TlsBroker]:
    work = tmp_path_factory.mktemp("grpc-tls")
    home = work / "home"
    home.mkdir()
    pki = ensure_dev_pki(work / "pki")
    port, grpc_port = free_port(), free_port()
    proc = ServiceProcess("broker", port, {
        "TIDEMQ_TLS_CA": str(pki.ca),
        "TIDEMQ_BROKER_PORT": str(port), "TIDEMQ_BROKER_GRPC_PORT": str(grpc_port),
        "TIDEMQ_BROKER_TLS_CERT": str(pki.cert), "TIDEMQ_BROKER_TLS_KEY": str(pki.key),
        "TIDEMQ_BROKER_DATA_DIR": str(work / "broker"), "TIDEMQ_BROKER_CLUSTER": unique("c"),
        "TIDEMQ_BROKER_REDIS_URL": redis_server.url, "TIDEMQ_BROKER_TOKEN": TOKEN,
        "TIDEMQ_BROKER_FLUSH_INTERVAL_MS": "50",
        "TIDEMQ_BROKER_SEGMENT_BYTES": str(64 * 1024 * 1024)}, work).start()
    try:
        wait_port(grpc_port)
        yield TlsBroker(pki, proc, f"127.0.0.1:{grpc_port}", rmq_python, home)
    finally:
        proc.stop()


def test_the_official_client_sends_and_receives_over_tls(broker: TlsBroker) -> None:
    topic = broker.topic()
    sent = answer(broker.run("send", "--topic", topic, "--count", "3", "--prefix", "tls"))
    assert [m["body"] for m in sent["sent"]] == ["tls-0", "tls-1", "tls-2"]
    got = answer(broker.run("receive", "--topic", topic, "--count", "3",
                            "--consumer-group", unique("g"), "--timeout", "30"))
    assert sorted(m["body"] for m in got["received"]) == ["tls-0", "tls-1", "tls-2"]
    assert "(TLS)" in broker.proc.logs()  # the door said it listens with TLS


def test_the_official_client_without_the_ca_gets_nothing_through(broker: TlsBroker) -> None:
    topic = broker.topic()
    for tls in (True, False):  # TLS with the default roots; plain text to a TLS port
        done = broker.run("send", "--topic", topic, "--count", "1", tls=tls, ca=False)
        assert done.returncode != 0, done.stdout
    got = answer(broker.run("receive", "--topic", topic, "--count", "1",
                            "--consumer-group", unique("g"), "--timeout", "3", "--wait", "1"))
    assert got["received"] == []  # nothing was stored
