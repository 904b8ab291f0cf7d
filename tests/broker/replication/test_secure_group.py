"""A replicated group with accounts on: the replica fetches the primary's log as its own
account (a signed request), so sync sends are acknowledged and the replica holds them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import RedisServer
from tests.support.acl import USERS, auth_of, write_acl
from tests.support.broker import BrokerHandle
from tests.support.replication import run_group
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration


def status(broker: BrokerHandle) -> dict[str, Any]:
    """The replication status, asked as the services' account (the token alone is refused
    once accounts are on)."""
    resp = broker.http.get("/internal/v1/replication/status", auth=auth_of("services"))
    assert resp.status_code == 200, resp.text
    answer: dict[str, Any] = resp.json()
    return answer


def test_a_replica_signs_its_fetches_when_accounts_are_on(tmp_path: Path,
                                                          redis_server: RedisServer) -> None:
    acl_file = tmp_path / "acl.yaml"
    write_acl(acl_file)
    ak, sk, _ = USERS["services"]
    with run_group(tmp_path, redis_server.url, 2, min_insync=2, acl_file=acl_file,
                   access_key=ak, secret_key=sk) as (primary, replica):
        # in sync only if the replica's fetches pass the primary's signature check
        wait_until(lambda: status(primary)["in_sync_copies"] >= 2, what="2 in-sync copies")
        admin = auth_of("admin")
        resp = primary.http.put("/v1/topics/orders-1", json={"queues": 1}, auth=admin)
        assert resp.status_code == 200, resp.text
        sent = primary.http.post("/v1/topics/orders-1/messages", auth=admin,
                                 json={"messages": [{"body": "paid", "queue_id": 0}]})
        assert sent.status_code == 200, sent.text  # acknowledged by two copies
        unsigned = primary.http.post("/v1/topics/orders-1/messages",
                                     json={"messages": [{"body": "x", "queue_id": 0}]})
        assert unsigned.status_code == 401
        end = status(primary)["log_end"]
        wait_until(lambda: status(replica)["log_end"] == end, what="replica caught up")
        got = replica.http.get("/v1/topics/orders-1/queues/0/messages",
                               params={"offset": 0}, auth=admin)
        assert got.status_code == 200, got.text
        assert [m["body"] for m in got.json()["messages"]] == ["paid"]
