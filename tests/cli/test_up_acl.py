"""`tidemq up --acl FILE`: every service it starts requires signed requests, the services sign
their own calls with the account it keeps in the data dir, and a bad file stops it at once."""

from __future__ import annotations

import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.acl import USERS, write_acl
from tests.support.procs import REPO, free_port
from tests.support.up import UpRun
from tidemq_server.cli.acl import SERVICE_ACCOUNT, SERVICES_FILE
from tidemq_server.common.auth.client import SigningAuth

pytestmark = pytest.mark.integration


def test_up_with_acl_turns_accounts_on_for_every_service(tmp_path: Path) -> None:
    acl = tmp_path / "acl.yaml"
    write_acl(acl, {k: USERS[k] for k in ("admin", "producer")})
    ports = {name: free_port() for name in ("nameserver", "broker", "checker", "scheduler")}
    up = UpRun(tmp_path, "--acl", str(acl), "--nameserver-port", str(ports["nameserver"]),
               "--broker-port", str(ports["broker"]), "--checker-port", str(ports["checker"]),
               "--scheduler-port", str(ports["scheduler"]), "--grpc-port", "0",
               "--skip", "console", "--no-metrics")
    try:
        up.wait_ready()  # the brokers registered: their account signed the heartbeats
        up.wait_for("ACL on")
        services = up.data_dir / SERVICES_FILE
        assert stat.S_IMODE(services.stat().st_mode) == 0o600
        [account] = yaml.safe_load(services.read_text())["users"]
        assert account["name"] == SERVICE_ACCOUNT
        assert account["secret_key"] not in up.output()  # never printed
        for name, port in ports.items():
            base = f"http://127.0.0.1:{port}"
            assert httpx.get(f"{base}/healthz").status_code == 200, name  # stays open
            probe = "/v1/cluster" if name == "nameserver" else "/v1/topics" \
                if name == "broker" else "/internal/v1/nothing"
            assert httpx.get(base + probe).status_code == 401, name
        broker = f"http://127.0.0.1:{ports['broker']}"
        admin = httpx.Client(auth=SigningAuth(*USERS["admin"][:2]))
        assert admin.put(f"{broker}/v1/topics/orders-up", json={"queues": 1}).status_code == 200
        producer = httpx.Client(auth=SigningAuth(*USERS["producer"][:2]))
        sent = producer.post(f"{broker}/v1/topics/orders-up/messages",
                             json={"messages": [{"body": "hi", "delay_ms": 600_000}]})
        assert sent.status_code == 200, sent.text
        # broker → scheduler → broker with the services' account: the delay is filed, then
        # cancelled through the broker
        mid = sent.json()["results"][0]["message_id"]
        deadline = time.monotonic() + 15
        while (cancelled := admin.delete(f"{broker}/v1/messages/{mid}/schedule")
               ).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert cancelled.status_code == 200, cancelled.text
        assert producer.put(f"{broker}/v1/topics/other", json={}).status_code == 403
        assert up.stop() == 0, up.output()
    finally:
        up.kill()


def test_up_refuses_a_bad_acl_file(tmp_path: Path) -> None:
    acl = tmp_path / "acl.yaml"
    acl.write_text("users:\n  - {name: x, access_key: A, secret_key: s, rules: "
                   "[{resource: 'queue:x', actions: [pub]}]}\n")
    done = subprocess.run([sys.executable, "-m", "tidemq_server.cli", "up", "--data-dir",
                           str(tmp_path / "data"), "--acl", str(acl)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "queue:x" in done.stdout + done.stderr
