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

import grpc
import pytest
from tidemq.protocol.signing import format_date, grpc_signature

from tests.support.acl import USERS, AclCluster, acl_cluster
from tests.support.procs import RedisServer
from tidemq_server.broker.grpc.proto import Code, service_grpc, service_pb

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


def _metadata(user: str, secret: str | None = None) -> tuple[tuple[str, str], ...]:
    ak, sk, _ = USERS[user]
    date = format_date()
    return (("x-mq-client-id", f"raw-{user}"), ("x-mq-date-time", date),
            ("authorization", f"MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders=x-mq-date-time, "
                              f"Signature={grpc_signature(secret or sk, date)}"))


async def test_raw_rpcs_end_only_a_transaction_of_the_named_topic(acl: AclCluster) -> None:
    admin = acl.client("admin")
    half = admin.post(f"{acl.broker_url}/v1/transactions", json={
        "producer_group": "pg-admin", "topic": "other-g", "message": {"body": "theirs"}})
    assert half.status_code == 200, half.text
    txid = half.json()["transaction_id"]
    async with grpc.aio.insecure_channel(acl.grpc_endpoint) as channel:
        stub = service_grpc.MessagingServiceStub(channel)

        def end(topic: str) -> Any:
            req = service_pb.EndTransactionRequest(transaction_id=txid)
            req.topic.name = topic
            req.resolution = 1  # COMMIT
            return req

        # the producer may pub on orders-g, not on other-g: naming orders-g does not help
        answer = await stub.EndTransaction(end("orders-g"), metadata=_metadata("producer"),
                                           timeout=10)
        assert answer.status.code == Code.FORBIDDEN, answer
        answer = await stub.EndTransaction(end("other-g"), metadata=_metadata("producer"),
                                           timeout=10)
        assert answer.status.code == Code.FORBIDDEN and "pub on topic:other-g" in \
            answer.status.message
        unsigned = await stub.EndTransaction(end("other-g"), timeout=10)
        assert unsigned.status.code == Code.UNAUTHORIZED
        wrong = await stub.EndTransaction(end("other-g"),
                                          metadata=_metadata("admin", secret="guess"),
                                          timeout=10)
        assert wrong.status.code == Code.UNAUTHORIZED
        with pytest.raises(grpc.aio.AioRpcError) as info:  # a stream has no Status to answer
            async for _ in stub.Telemetry(iter(()), timeout=10):
                pass
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    state = admin.get(f"{acl.broker_url}/v1/transactions",
                      params={"producer_group": "pg-admin"}).json()["transactions"]
    assert [t["transaction_id"] for t in state] == [txid]  # still pending: nothing ended it
