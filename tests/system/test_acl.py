"""Accounts and ACL on real processes: users by resources by actions through REST, the SDK and
the CLI; signatures that must fail; services as accounts; reload of the ACL file.

One cluster (nameserver, broker, checker, scheduler; tests/support/acl.py) serves the module.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tidemq import (
    ConsumeResult,
    Credentials,
    ForbiddenError,
    Producer,
    PushConsumer,
    ReceivedMessage,
    SimpleConsumer,
    UnauthorizedError,
)
from tidemq.protocol.signing import sign_rest

from tests.support.acl import USERS, AclCluster, acl_cluster, write_acl
from tests.support.broker import TOKEN
from tests.support.procs import REPO, RedisServer, ServiceProcess, free_port
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration

TOPICS = ("orders-a", "orders-secret", "other")
SEND = {"messages": [{"body": "x"}]}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory,
            redis_server: RedisServer) -> Iterator[AclCluster]:
    with acl_cluster(tmp_path_factory.mktemp("acl"), redis_server, grpc=False) as c:
        admin = c.client("admin")
        for topic in TOPICS:
            resp = admin.put(f"{c.broker_url}/v1/topics/{topic}", json={"queues": 2})
            assert resp.status_code == 200, resp.text
        yield c


def call(c: AclCluster, user: str | None, case: str) -> httpx.Response:
    """One request of the matrix, as ``user``."""
    http, b, n = c.client(user), c.broker_url, c.nameserver_url
    receive = {"max": 1, "wait_ms": 0}
    requests: dict[str, Any] = {
        "send orders-a": lambda: http.post(f"{b}/v1/topics/orders-a/messages", json=SEND),
        "send other": lambda: http.post(f"{b}/v1/topics/other/messages", json=SEND),
        "pull orders-a": lambda: http.get(f"{b}/v1/topics/orders-a/queues/0/messages",
                                          params={"offset": 0, "group": "billing"}),
        "pull orders-secret": lambda: http.get(f"{b}/v1/topics/orders-secret/queues/0/messages",
                                               params={"offset": 0}),
        "create orders-new": lambda: http.put(f"{b}/v1/topics/orders-new", json={"queues": 1}),
        "receive billing orders-a": lambda: http.post(
            f"{b}/v1/groups/billing/receive", json={"topic": "orders-a", **receive}),
        "receive billing other": lambda: http.post(
            f"{b}/v1/groups/billing/receive", json={"topic": "other", **receive}),
        "receive audit orders-a": lambda: http.post(
            f"{b}/v1/groups/audit/receive", json={"topic": "orders-a", **receive}),
        "half pg-orders orders-a": lambda: http.post(f"{b}/v1/transactions", json={
            "producer_group": "pg-orders", "topic": "orders-a", "message": {"body": "h"}}),
        "half pg-x orders-a": lambda: http.post(f"{b}/v1/transactions", json={
            "producer_group": "pg-x", "topic": "orders-a", "message": {"body": "h"}}),
        "internal info": lambda: http.get(f"{b}/internal/v1/schedule/info",
                                          headers={"X-Tidemq-Token": TOKEN}),
        "route orders-a": lambda: http.get(f"{n}/v1/routes/orders-a"),
        "register broker": lambda: http.post(f"{n}/v1/brokers/heartbeat", headers={
            "X-Tidemq-Token": TOKEN}, json={"cluster": "x", "broker_name": "rogue",
                                            "address": "http://127.0.0.1:1", "topics": {}}),
    }
    return requests[case]()  # type: ignore[no-any-return]


OK, NO = 200, 403
#: case → expected status for (unsigned, nobody, producer, consumer, admin)
MATRIX: dict[str, tuple[int, int, int, int, int]] = {
    "send orders-a": (401, NO, OK, NO, OK),
    "send other": (401, NO, NO, NO, OK),
    "pull orders-a": (401, NO, NO, OK, OK),
    "pull orders-secret": (401, NO, NO, NO, OK),
    "create orders-new": (401, NO, NO, NO, OK),
    "receive billing orders-a": (401, NO, NO, OK, OK),
    "receive billing other": (401, NO, NO, NO, OK),
    "receive audit orders-a": (401, NO, NO, NO, OK),
    "half pg-orders orders-a": (401, NO, OK, NO, OK),
    "half pg-x orders-a": (401, NO, NO, NO, OK),
    "internal info": (401, NO, NO, NO, OK),
    "route orders-a": (401, NO, OK, OK, OK),
    "register broker": (401, NO, NO, NO, OK),
}
WHO: tuple[str | None, ...] = (None, "nobody", "producer", "consumer", "admin")


def test_rest_matrix_and_nothing_unauthorised_is_stored(cluster: AclCluster) -> None:
    wrong = []
    for case, expected in MATRIX.items():
        for user, status in zip(WHO, expected, strict=True):
            if case == "create orders-new" and user == "admin":
                continue  # checked below: that orders-new does not exist yet
            resp = call(cluster, user, case)
            if resp.status_code != status:
                wrong.append(f"{case} as {user}: {resp.status_code} {resp.text[:200]}")
            elif status in (401, 403):
                code = resp.json()["code"]
                if code != ("UNAUTHORIZED" if status == 401 else "FORBIDDEN"):
                    wrong.append(f"{case} as {user}: code {code}")
    assert not wrong, "\n".join(wrong)
    # a 403 names the resource and the action
    refused = call(cluster, "producer", "send other").json()["message"]
    assert "pub" in refused and "topic:other" in refused and "producer" in refused

    admin, b = cluster.client("admin"), cluster.broker_url

    def stored(topic: str) -> int:
        resp = admin.get(f"{b}/v1/topics/{topic}")
        assert resp.status_code == 200, resp.text
        return sum(q["max"] for q in resp.json()["offsets"])

    assert stored("orders-a") == 2  # producer's and admin's sends only
    assert stored("other") == 1  # admin's only
    assert admin.get(f"{b}/v1/topics/orders-new").status_code == 404  # never created
    halves = {g: admin.get(f"{b}/v1/transactions", params={"producer_group": g}).json()
              for g in ("pg-orders", "pg-x")}
    assert len(halves["pg-orders"]["transactions"]) == 2  # the producer's and the admin's
    assert len(halves["pg-x"]["transactions"]) == 1  # the admin's, none of the producer's
    brokers = admin.get(f"{cluster.nameserver_url}/v1/cluster").json()["brokers"]
    names = {x["broker_name"] for x in brokers}
    assert "broker-a" in names  # the broker's own account (cluster admin) registered it
    assert "rogue" in names  # the admin's registration only
    metrics = httpx.get(f"{b}/metrics").text  # open without a signature
    assert 'tidemq_auth_failures_total{door="rest",reason="forbidden"}' in metrics
    assert 'tidemq_auth_failures_total{door="rest",reason="missing"}' in metrics
    assert "sk-prod" not in cluster.procs["broker"].logs()  # never a secret in the logs


def _signed(user: str, method: str, path: str, body: bytes, *, secret: str | None = None,
            when_s: float | None = None) -> dict[str, str]:
    ak, sk, _ = USERS[user]
    headers = sign_rest(ak, secret or sk, method, path, "", body, when_s)
    return {**headers, "content-type": "application/json"}


def test_bad_signatures_are_refused(cluster: AclCluster) -> None:
    path = "/v1/topics/orders-a/messages"
    body = b'{"messages": [{"body": "signed"}]}'
    url = cluster.broker_url + path
    good = _signed("producer", "POST", path, body)
    cases = {
        "tampered body": (good, b'{"messages": [{"body": "evil"}]}'),
        "wrong secret": (_signed("producer", "POST", path, body, secret="guess"), body),
        "unknown key": ({**good, "Authorization": good["Authorization"].replace(
            "AK_PROD", "AK_GHOST")}, body),
        "stale date": (_signed("producer", "POST", path, body, when_s=time.time() - 16 * 60),
                       body),
        "future date": (_signed("producer", "POST", path, body, when_s=time.time() + 16 * 60),
                        body),
        "bad scheme": ({**good, "Authorization": "Basic QUtfUFJPRDpzay1wcm9k"}, body),
    }
    before = cluster.client("admin").get(f"{cluster.broker_url}/v1/topics/orders-a").json()
    for name, (headers, content) in cases.items():
        resp = httpx.post(url, content=content, headers=headers)
        assert resp.status_code == 401, f"{name}: {resp.status_code} {resp.text}"
        assert resp.json()["code"] == "UNAUTHORIZED", name
    # the same signed request, sent again inside the window, is accepted (idempotent by id)
    assert httpx.post(url, content=body, headers=good).status_code == 200
    # captured 20 minutes ago and replayed now: outside the window
    old = _signed("producer", "POST", path, body, when_s=time.time() - 20 * 60)
    assert httpx.post(url, content=body, headers=old).status_code == 401
    after = cluster.client("admin").get(f"{cluster.broker_url}/v1/topics/orders-a").json()
    grown = sum(q["max"] for q in after["offsets"]) - sum(q["max"] for q in before["offsets"])
    assert grown == 1  # only the good request stored anything
    logs = cluster.procs["broker"].logs()
    assert "stale_date" in logs and "bad_signature" in logs and "unknown_key" in logs


def test_services_are_accounts(cluster: AclCluster, tmp_path: Path,
                               redis_server: RedisServer) -> None:
    admin, b = cluster.client("admin"), cluster.broker_url
    # broker → scheduler and scheduler → broker: a delayed message is filed, then cancelled
    sent = cluster.client("producer").post(f"{b}/v1/topics/orders-a/messages", json={
        "messages": [{"body": "later", "delay_ms": 600_000}]})
    assert sent.status_code == 200, sent.text
    message_id = sent.json()["results"][0]["message_id"]
    deadline = time.monotonic() + 15
    while True:
        resp = admin.delete(f"{b}/v1/messages/{message_id}/schedule")
        if resp.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert resp.status_code == 200 and resp.json()["state"] == "cancelled", resp.text
    # checker → broker: a scan reads the half queue through the internal API
    scan = admin.post(f"{cluster.procs['checker'].url}/internal/v1/scan")
    assert scan.status_code == 200, scan.text
    # a broker whose account lacks cluster admin cannot register
    port = free_port()
    ak, sk, _ = USERS["producer"]
    rogue = ServiceProcess("broker", port, {
        "TIDEMQ_BROKER_PORT": str(port), "TIDEMQ_BROKER_BROKER_NAME": "broker-weak",
        "TIDEMQ_BROKER_DATA_DIR": str(tmp_path / "weak"), "TIDEMQ_BROKER_REDIS_URL":
        redis_server.url, "TIDEMQ_BROKER_NAMESERVERS": cluster.nameserver_url,
        "TIDEMQ_BROKER_REGISTER_INTERVAL_S": "0.2", "TIDEMQ_BROKER_ACCESS_KEY": ak,
        "TIDEMQ_BROKER_SECRET_KEY": sk}, tmp_path).start()
    try:
        wait_until(lambda: "403" in rogue.logs() or "FORBIDDEN" in rogue.logs(),
                   what="the rogue broker's registration refused")
        names = {x["broker_name"] for x in
                 admin.get(f"{cluster.nameserver_url}/v1/cluster").json()["brokers"]}
        assert "broker-weak" not in names
    finally:
        rogue.stop()


async def test_sdk_signs_with_credentials_or_the_environment(
        cluster: AclCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    ak, sk, _ = USERS["producer"]
    monkeypatch.delenv("TIDEMQ_ACCESS_KEY", raising=False)
    monkeypatch.delenv("TIDEMQ_SECRET_KEY", raising=False)
    async with Producer(broker_url=cluster.broker_url, credentials=Credentials(ak, sk)) as p:
        result = await p.send("from the sdk", topic="orders-a")
        assert result.message_id
        with pytest.raises(ForbiddenError, match="topic:other"):
            await p.send("nope", topic="other")
    async with Producer(broker_url=cluster.broker_url) as p:
        with pytest.raises(UnauthorizedError):
            await p.send("unsigned", topic="orders-a")
    cak, csk, _ = USERS["consumer"]
    monkeypatch.setenv("TIDEMQ_ACCESS_KEY", cak)
    monkeypatch.setenv("TIDEMQ_SECRET_KEY", csk)
    async with SimpleConsumer("billing", topic="orders-a", broker_url=cluster.broker_url) as c:
        got: list[Any] = []
        deadline = time.monotonic() + 10
        while not any(m.body == b"from the sdk" for m in got) and time.monotonic() < deadline:
            got += await c.receive(max=32, wait_ms=500)
        assert any(m.body == b"from the sdk" for m in got)
    async with SimpleConsumer("billing", topic="other", broker_url=cluster.broker_url) as c:
        with pytest.raises(ForbiddenError, match="topic:other"):
            await c.receive(max=1, wait_ms=0)


def _cli(cluster: AclCluster, user: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMQ_")}
    if user:
        env["TIDEMQ_ACCESS_KEY"], env["TIDEMQ_SECRET_KEY"], _ = USERS[user]
    return subprocess.run([sys.executable, "-m", "tidemq_server.cli",
                           "--broker", cluster.broker_url,
                           "--nameserver", cluster.nameserver_url, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


def test_cli_signs_from_the_environment(cluster: AclCluster) -> None:
    ok = _cli(cluster, "producer", "send", "orders-a", "from the cli")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    refused = _cli(cluster, "consumer", "send", "orders-a", "nope")
    assert refused.returncode != 0 and "FORBIDDEN" in refused.stdout + refused.stderr
    admin = cluster.client("admin")
    bodies = [m["body"] for q in (0, 1) for m in admin.get(
        f"{cluster.broker_url}/v1/topics/orders-a/queues/{q}/messages",
        params={"offset": 0, "max": 1024}).json()["messages"]]
    assert "from the cli" in bodies and "nope" not in bodies


def test_the_file_is_reloaded_and_a_bad_file_keeps_the_last_good(cluster: AclCluster) -> None:
    nobody = cluster.client("nobody")
    url = f"{cluster.broker_url}/v1/topics/orders-a/messages"
    assert nobody.post(url, json=SEND).status_code == 403
    users = dict(USERS)
    ak, sk, _ = USERS["nobody"]
    users["nobody"] = (ak, sk, [{"resource": "topic:orders-a", "actions": ["pub"]}])
    write_acl(cluster.acl_file, users)
    deadline = time.monotonic() + 10
    while nobody.post(url, json=SEND).status_code != 200:
        assert time.monotonic() < deadline, "the ACL file was not reloaded"
        time.sleep(0.2)
    cluster.acl_file.write_text("users: [ {name: broken\n")
    # the broker's reload check (every 1 s) read the broken file and refused it
    wait_until(lambda: 'tidemq_acl_reloads{result="failed"} 1.0' in httpx.get(
        f"{cluster.broker_url}/metrics").text, what="the broken file refused")
    assert "NOT loaded" in cluster.procs["broker"].logs()
    assert nobody.post(url, json=SEND).status_code == 200  # the last good rules stay
    write_acl(cluster.acl_file)  # back to the module's rules
    deadline = time.monotonic() + 10
    while nobody.post(url, json=SEND).status_code != 403:
        assert time.monotonic() < deadline, "the ACL file was not reloaded"
        time.sleep(0.2)


async def test_push_consumer_through_the_nameserver_with_acl(cluster: AclCluster) -> None:
    """Routes, group heartbeat with subscriptions, pulls with the group, offset commits: all
    signed and allowed for the consumer's account."""
    async with Producer(nameservers=[cluster.nameserver_url],
                        credentials=Credentials(*USERS["producer"][:2])) as p:
        await p.send("pushed", topic="orders-a")
    got: list[bytes] = []

    async def handle(message: ReceivedMessage) -> ConsumeResult:
        got.append(message.body)
        return ConsumeResult.SUCCESS

    consumer = PushConsumer("billing", handler=handle, nameservers=[cluster.nameserver_url],
                            credentials=Credentials(*USERS["consumer"][:2]),
                            offset_commit_interval_s=0.2, pull_wait_ms=200)
    consumer.subscribe("orders-a")
    async with consumer:
        deadline = time.monotonic() + 15
        while b"pushed" not in got:
            assert time.monotonic() < deadline, got
            await asyncio.sleep(0.1)
    admin = cluster.client("admin")
    offsets = admin.get(f"{cluster.broker_url}/v1/groups/billing/offsets",
                        params={"topic": "orders-a"}).json()["offsets"]
    assert sum(o["offset"] for o in offsets) > 0  # the consumer's commits were accepted
