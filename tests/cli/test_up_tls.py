"""`tidemq up --tls`: a development CA under <data-dir>/tls, every service on HTTPS, the CA's
path printed; clients holding it work, and the routes carry https://."""

from __future__ import annotations

import json
import ssl
from pathlib import Path

import httpx
import pytest
from tidemq import use_ca_bundle
from typer.testing import CliRunner

from tests.support.procs import free_port
from tests.support.up import WIDE, UpRun, free_base
from tidemq_server.cli import app

pytestmark = pytest.mark.integration


def test_up_tls_serves_every_port_with_the_ca_it_prints(tmp_path: Path) -> None:
    ns, broker = free_port(), free_base(1, 1000)
    checker, scheduler = free_base(1, 1000), free_base(1, 1000)
    up = UpRun(tmp_path, "--tls", "--no-metrics", "--nameserver-port", str(ns),
               "--broker-port", str(broker), "--checker-port", str(checker),
               "--scheduler-port", str(scheduler), "--grpc-port", "0")
    try:
        up.wait_ready(120)
        up.wait_for("Ctrl-C stops everything")
        ca = up.data_dir.resolve() / "tls" / "ca.pem"
        assert f"TLS on: CA {ca}" in " ".join(up.output().split())
        verify = ssl.create_default_context(cafile=str(ca))
        for port in (ns, broker, checker, scheduler):
            url = f"https://127.0.0.1:{port}"
            assert httpx.get(url + "/healthz", verify=verify, timeout=5).status_code == 200
            with pytest.raises(httpx.RemoteProtocolError):  # plain HTTP: no answer
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
        view = httpx.get(f"https://127.0.0.1:{ns}/v1/cluster", verify=verify, timeout=5).json()
        assert [b["address"] for b in view["brokers"]] == [f"https://127.0.0.1:{broker}"]
        use_ca_bundle(None)  # as in a fresh CLI process: the context comes from the variable
        try:
            result = CliRunner().invoke(app, ["--nameserver", f"https://127.0.0.1:{ns}",
                                              "cluster", "--json"],
                                        env={**WIDE, "TIDEMQ_TLS_CA": str(ca)})
        finally:
            use_ca_bundle(None)
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["brokers"][0]["address"].startswith("https://")
        assert up.stop() == 0, up.output()
    finally:
        up.kill()
