"""A transaction left for check-back keeps being checked across failovers, until it ends.

The faults suite saw transactions committed by check-back never delivered: their checks
stopped after re-put copies written by two successive primaries. One way there, seen in its
logs: the checker follows the group's address through the nameservers, which learn of a
failover seconds late, so it sends its decisions to a replica — the primary it was before.
That copy's table still held the transaction as its own term had left it (the older copy),
the replicated newer copy was in its half queue, and the decision on it was answered
``superseded`` with nothing to write. The checker moved past the transaction's only live
copy, and nothing checked it again. Only the writable primary decides now, and only about
copies a quorum holds.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import RedisServer
from tests.support.broker import TOKEN, BrokerHandle
from tests.support.clock import now_ms
from tests.support.replication import bodies, run_group, set_role, status, wait_in_sync
from tests.support.transactions import run_checker
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration

TIMEOUT_MS = 1000  # the checker's transaction timeout: a copy is checked this long after it
GROUP = "pg"
SLOW = {"check_interval_ms": 60_000, "transaction_timeout_ms": TIMEOUT_MS}


def check_times(broker: BrokerHandle) -> int:
    resp = broker.http.get("/v1/transactions", params={"producer_group": GROUP,
                                                        "state": "pending"})
    assert resp.status_code == 200, resp.text
    [tx] = resp.json()["transactions"]
    return int(tx["check_times"])


def answer_check(broker: BrokerHandle, txid: str, action: str) -> int | None:
    """Be the producer: heartbeat, poll the checks for a few seconds, end ours with ``action``;
    the check count it came with (None: no check of it was offered)."""
    beat = broker.http.post(f"/v1/producers/{GROUP}/heartbeat", json={"client_id": "p1"})
    assert beat.status_code == 200, beat.text
    resp = broker.http.get(f"/v1/producers/{GROUP}/checks",
                           params={"client_id": "p1", "wait_ms": 2000})
    assert resp.status_code == 200, resp.text
    ours = [c for c in resp.json()["checks"] if c["transaction_id"] == txid]
    if not ours:
        return None
    ended = broker.http.post(f"/v1/transactions/{txid}/end", json={
        "producer_group": GROUP, "action": action, "from_check": True})
    assert ended.status_code == 200, ended.text
    return int(ours[-1]["check_times"])


def newest_copy(broker: BrokerHandle, txid: str) -> dict[str, Any]:
    """The newest half copy of ``txid`` in ``broker``'s half queue."""
    halves = broker.http.get("/internal/v1/transactions/halves", params={"max": 64},
                             headers={"X-Tidemq-Token": TOKEN})
    assert halves.status_code == 200, halves.text
    entry: dict[str, Any] = [e for e in halves.json()["entries"]
                             if e["transaction_id"] == txid][-1]
    return entry


def check_newest_copy(broker: BrokerHandle, txid: str) -> None:
    """What the checker does to a copy that fell due: ask its broker to check it."""
    auth = {"X-Tidemq-Token": TOKEN}
    newest = newest_copy(broker, txid)
    resp = broker.http.post("/internal/v1/transactions/actions", headers=auth, json={
        "actions": [{"transaction_id": txid, "physical_offset": newest["physical_offset"],
                     "action": "check"}]})
    assert resp.status_code == 200, resp.text
    assert resp.json()["results"][0]["outcome"] == "checked", resp.text


def test_a_replica_does_not_answer_the_checker_and_the_checks_go_on(
        tmp_path: Path, redis_server: RedisServer) -> None:
    redis = redis_server.url
    with run_group(tmp_path, redis, 2) as (old, new):
        wait_in_sync(old, 2)
        topic = old.create_topic(queues=1)
        begun = old.http.post("/v1/transactions", json={
            "producer_group": GROUP, "topic": topic,
            "message": {"body": "T", "message_id": "id-T"}})
        assert begun.status_code == 200, begun.text
        txid = begun.json()["transaction_id"]

        # the first primary checks it (nobody answers): its table holds the copy it re-put
        check_newest_copy(old, txid)
        set_role(old, "replica", 2, new.url)
        set_role(new, "primary", 2)
        wait_in_sync(new, 2)

        # the new primary checks it again; the old one, now its replica, copies that copy
        before = check_times(new)
        with run_checker(tmp_path, new, redis, **SLOW):
            asked = wait_until(lambda: answer_check(new, txid, "unknown"),
                               what="a check by the new primary, answered unknown")
        assert asked > before
        last = check_times(new)  # the newest copy's count (checks offered since: at most this)
        end = status(new)["log_end"]
        wait_until(lambda: status(old)["hwm"] >= end, what="the replica holds the new copy")
        # the new copy is due: TIMEOUT_MS after it was stored, by the broker's own record
        stored = newest_copy(new, txid)["store_timestamp_ms"]
        wait_until(lambda: now_ms() > stored + TIMEOUT_MS, what="the new copy due")

        # the checker still goes to the old address (the nameservers have not caught up)
        with run_checker(tmp_path, old, redis, **SLOW) as stale:
            scan = stale.http.post("/internal/v1/scan", headers={"X-Tidemq-Token": TOKEN})

        # back at the primary: the transaction is checked again and the answer commits it
        with run_checker(tmp_path, new, redis, **SLOW):
            again = wait_until(lambda: answer_check(new, txid, "commit"), timeout=30,
                               what="checked again")
        assert again > last  # a check of the newest copy, not one offered before
        wait_until(lambda: bodies(new, topic) == ["T"], what="committed by the check answer")
        # the replica refused to decide anything: the scan through it failed, moved nothing
        assert scan.status_code == 503, scan.text
        assert "NOT_PRIMARY" in scan.json()["message"], scan.text

        # a copy the primary holds above its high-water mark (the checker can name one it
        # read from another copy) is not decided yet: not "not found", which passes it
        replica = old.proc.proc
        assert replica is not None
        at = status(new)["log_end"]
        replica.send_signal(signal.SIGSTOP)
        try:
            new.error(new.http.post("/v1/transactions", json={
                "producer_group": "pg2", "topic": topic, "message": {"body": "U"}}),
                503, "NOT_ENOUGH_REPLICAS")
            new.error(new.http.post("/internal/v1/transactions/actions",
                                    headers={"X-Tidemq-Token": TOKEN},
                                    json={"actions": [{"transaction_id": "unsettled",
                                                       "physical_offset": at,
                                                       "action": "check"}]}),
                      503, "NOT_ENOUGH_REPLICAS")
        finally:
            replica.send_signal(signal.SIGCONT)
