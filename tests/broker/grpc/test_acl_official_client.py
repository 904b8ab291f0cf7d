"""The official RocketMQ 5 Python client with ``Credentials(ak, sk)`` against a broker with
accounts on: allowed calls work, others raise the client's Unauthorized / Forbidden exceptions,
and nothing refused is stored or delivered (read back over REST as an admin)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.acl import USERS, AclCluster, acl_cluster
from tests.support.procs import RedisServer

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).with_name("rmq_acl_client.py")


@pytest.fixture(scope="module")
def acl(tmp_path_factory: pytest.TempPathFactory,
        redis_server: RedisServer) -> Iterator[AclCluster]:
    with acl_cluster(tmp_path_factory.mktemp("grpc-acl"), redis_server) as c:
        admin = c.client("admin")
        for topic in ("orders-g", "other-g"):
            resp = admin.put(f"{c.broker_url}/v1/topics/{topic}", json={"queues": 2})
            assert resp.status_code == 200, resp.text
        yield c


def official(acl: AclCluster, python: Path, user: str, action: str, topic: str,
             group: str = "billing", secret: str | None = None,
             access_key: str | None = None) -> dict[str, Any]:
    ak, sk, _ = USERS[user]
    ak = access_key or ak
    home = acl.work / f"home-{time.monotonic_ns()}"  # its own client log
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "TZ": "UTC"}  # the client signs its local time
    env.pop("PYTHONPATH", None)
    done = subprocess.run([str(python), str(SCRIPT), acl.grpc_endpoint, ak, secret or sk,
                           action, topic, group], env=env, capture_output=True, text=True,
                          timeout=90, cwd=str(home))
    lines = [x for x in done.stdout.splitlines() if x.strip()]
    assert lines, f"client failed ({done.returncode}):\n{done.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def stored_bodies(acl: AclCluster, topic: str) -> list[str]:
    admin = acl.client("admin")
    return [m["body"] for q in (0, 1) for m in admin.get(
        f"{acl.broker_url}/v1/topics/{topic}/queues/{q}/messages",
        params={"offset": 0, "max": 1024}).json()["messages"]]


def refused_as(result: dict[str, Any], exception: str) -> bool:
    """The call failed with ``exception``: raised, or (a route query the client wraps) logged."""
    return not result["ok"] and (result["error"] == exception or
                                 result.get("logged") == [exception])


def test_official_client_matrix(acl: AclCluster, rmq_python: Path) -> None:
    sent = official(acl, rmq_python, "producer", "send", "orders-g")
    assert sent["ok"], sent
    # no right at all on the topic: its route is refused already
    refused = official(acl, rmq_python, "producer", "send", "other-g")
    assert refused_as(refused, "ForbiddenException"), refused
    # sub but not pub: the route is given, the send refused
    consumer_send = official(acl, rmq_python, "consumer", "send", "orders-g")
    assert consumer_send["error"] == "ForbiddenException", consumer_send
    assert "pub on topic:orders-g" in consumer_send["message"]
    wrong = official(acl, rmq_python, "producer", "send", "orders-g", secret="guess")
    assert refused_as(wrong, "UnauthorizedException"), wrong
    unknown = official(acl, rmq_python, "producer", "send", "orders-g", access_key="AK_GHOST")
    assert refused_as(unknown, "UnauthorizedException"), unknown
    committed = official(acl, rmq_python, "producer", "transaction", "orders-g")
    assert committed["ok"], committed  # SendMessage (half) and EndTransaction: topic pub
    assert stored_bodies(acl, "orders-g") == ["grpc-AK_PROD", "grpc-AK_PROD"]
    assert stored_bodies(acl, "other-g") == []
    other_group = official(acl, rmq_python, "consumer", "receive", "orders-g", group="audit")
    assert refused_as(other_group, "ForbiddenException"), other_group
    producer_reads = official(acl, rmq_python, "producer", "receive", "orders-g")
    assert refused_as(producer_reads, "ForbiddenException"), producer_reads
    received = official(acl, rmq_python, "consumer", "receive", "orders-g")
    assert received["ok"] and received["bodies"] == ["grpc-AK_PROD", "grpc-AK_PROD"], received
    metrics = acl.client(None).get(f"{acl.broker_url}/metrics").text
    assert 'tidemq_auth_failures_total{door="grpc",reason="forbidden"}' in metrics
    assert 'tidemq_auth_failures_total{door="grpc",reason="bad_signature"}' in metrics
