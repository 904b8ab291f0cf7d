"""Promote and demote through the role seam (its internal endpoint), with real processes: a
former primary truncates the tail only it held and follows its successor; epochs fence."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import RedisServer
from tests.support.replication import paused, read_log, run_group, set_role, status, wait_in_sync
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration


def test_failover_through_the_seam_truncates_the_divergent_tail(
        tmp_path: Path, redis_server: RedisServer) -> None:
    with run_group(tmp_path, redis_server.url, 2) as (old, new):
        token = {"x-tidemq-token": old.env["TIDEMQ_BROKER_TOKEN"]}
        wait_in_sync(old, 2)
        topic = old.create_topic(queues=1)
        old.send(topic, {"body": "A", "message_id": "id-A"})
        end_a = status(old)["log_end"]
        with paused(new):
            time.sleep(0.6)  # its fetch held at the log end (200 ms) is answered empty first
            resp = old.http.post(f"/v1/topics/{topic}/messages",
                                 json={"messages": [{"body": "B", "message_id": "id-B"}]})
            old.error(resp, 503, "NOT_ENOUGH_REPLICAS")
            assert status(old)["log_end"] > end_a  # B is on the old primary only
            after = set_role(old, "replica", 2, new.url)  # writes stop at once
            assert after["role"] == "replica" and after["epoch"] == 2
        promoted = set_role(new, "primary", 2)
        assert promoted["role"] == "primary" and promoted["epochs"] == [[1, 0], [2, end_a]]
        wait_in_sync(new, 2)
        wait_until(lambda: status(old)["log_end"] == status(new)["log_end"],
                   what="the former primary truncated and caught up")
        assert new.send(topic, {"body": "C", "message_id": "id-C"})[0]["queue_offset"] == 1
        wait_until(lambda: status(old)["log_end"] == status(new)["log_end"] and
                   status(old)["hwm"] == status(new)["log_end"], what="C copied")
        assert read_log(old) == read_log(new)
        assert [m["body"] for m in old.pull(topic, 0, 0)["messages"]] == ["A", "C"]
        assert old.http.get("/v1/messages/id-B").status_code == 404
        st = status(old)
        assert st["epochs"] == [[1, 0], [2, end_a]] and st["primary_address"] == new.url
        assert st["following"] == new.url
        refused = old.http.post(f"/v1/topics/{topic}/messages",
                                json={"messages": [{"body": "D"}]})
        assert new.url in old.error(refused, 503, "NOT_PRIMARY")
        stale = old.http.post("/internal/v1/replication/role", headers=token,
                              json={"role": "primary", "epoch": 1})
        old.error(stale, 400, "BAD_REQUEST")

        # a follower showing a newer epoch deposes the primary: it acknowledges nothing more
        resp = new.http.get("/internal/v1/replication/fetch", headers=token, params={
            "from": 0, "broker_id": 7, "epoch": 3})
        new.error(resp, 503, "NOT_PRIMARY")
        assert status(new)["deposed"]
        refused = new.http.post(f"/v1/topics/{topic}/messages",
                                json={"messages": [{"body": "E"}]})
        assert "newer epoch" in new.error(refused, 503, "NOT_PRIMARY")
        assert [m["body"] for m in new.pull(topic, 0, 0)["messages"]] == ["A", "C"]


def test_a_promoted_replica_ends_transactions_and_dedups_what_its_primary_stored(
        tmp_path: Path, redis_server: RedisServer) -> None:
    with run_group(tmp_path, redis_server.url, 3) as (old, r1, r2):
        wait_in_sync(old, 3)
        topic = old.create_topic(queues=1)
        half = old.http.post("/v1/transactions", json={
            "producer_group": "pg", "topic": topic, "message": {"body": "tx"}})
        assert half.status_code == 200, half.text
        txid = half.json()["transaction_id"]
        first = old.send(topic, {"body": "once", "message_id": "dup-1"})[0]
        end = status(old)["log_end"]
        wait_until(lambda: status(r1)["hwm"] == end and status(r2)["log_end"] == end,
                   what="both replicas hold everything")
        old.proc.kill()
        set_role(r1, "primary", 2)
        set_role(r2, "replica", 2, r1.url)
        wait_in_sync(r1, 2)
        ended = r1.http.post(f"/v1/transactions/{txid}/end",
                             json={"producer_group": "pg", "action": "commit"})
        assert ended.status_code == 200 and ended.json()["state"] == "committed", ended.text
        again = r1.send(topic, {"body": "once", "message_id": "dup-1"})[0]
        assert again["queue_offset"] == first["queue_offset"]  # answered, not stored twice
        assert [m["body"] for m in r1.pull(topic, 0, 0)["messages"]] == ["once", "tx"]
        wait_until(lambda: [m["body"] for m in r2.pull(topic, 0, 0)["messages"]] ==
                   ["once", "tx"], what="the other replica follows the new primary")
