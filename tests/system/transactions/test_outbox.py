"""The outbox listener end to end against SQLite with a business table, producers in their own
processes: commit, a failing business change, a crash between the local commit and the end
(another instance answers the check from the table), and a local transaction that never ran."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.support.transactions import (
    INTERVAL_MS,
    Cluster,
    Producer,
    delivered,
    pending,
    sent_of,
    state_of,
    unique,
)
from tests.support.wait import quiet_for, wait_until

pytestmark = pytest.mark.integration


def rows(db: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return list(conn.execute(sql))


def test_outbox_commits_with_the_business_change(cluster: Cluster, tmp_path: Path) -> None:
    b = cluster.broker
    topic, group, db = b.create_topic(queues=2), unique("G"), tmp_path / "shop.db"
    p = Producer(b, group, cluster.workdir, "--topic", topic, "--count", "3",
                 "--outbox", str(db))
    sent = sent_of(p)
    assert p.stop() == 0, p.stderr()
    assert {s["local_state"] for s in sent} == {"commit"}
    mids = sorted(s["message_id"] for s in sent)
    assert sorted(r[0] for r in rows(db, "select message_id from orders")) == mids
    assert sorted(r[0] for r in rows(db, "select message_id from tidemq_outbox")) == mids
    wait_until(lambda: len(delivered(b, topic, 2)) == 3, what="delivery")
    assert sorted(m["message_id"] for m in delivered(b, topic, 2)) == mids


def test_outbox_failed_business_change_rolls_back(cluster: Cluster, tmp_path: Path) -> None:
    b = cluster.broker
    topic, group, db = b.create_topic(queues=1), unique("G"), tmp_path / "shop.db"
    p = Producer(b, group, cluster.workdir, "--topic", topic, "--count", "2",
                 "--outbox", str(db), "--fail-business")
    sent = sent_of(p)
    assert p.stop() == 0, p.stderr()
    assert {s["local_state"] for s in sent} == {"rollback"}
    assert all("business rule violated" in s["error"] for s in sent)
    assert rows(db, "select * from orders") == []  # the business change rolled back with it
    assert rows(db, "select * from tidemq_outbox") == []
    assert {state_of(b, s["message_id"]) for s in sent} == {"rolled_back"}
    assert delivered(b, topic, 1) == []


def test_outbox_answers_the_check_after_a_crash(cluster: Cluster, tmp_path: Path) -> None:
    b = cluster.broker
    topic, group, db = b.create_topic(queues=1), unique("G"), tmp_path / "shop.db"
    crashing = Producer(b, group, cluster.workdir, "--topic", topic, "--count", "1",
                        "--outbox", str(db), "--crash-after-local-commit", "--immunity", "1")
    [committed] = [x["local_commit"] for x in crashing.wait_for(
        lambda ls: any("local_commit" in x for x in ls)) if "local_commit" in x]
    crashing.proc.wait(10)
    assert rows(db, "select message_id from orders") == [(committed,)]
    assert state_of(b, committed) == "half"  # the end never left the dead process
    # a transaction that never reached the database: the half message alone
    orphan = b.http.post("/v1/transactions", json={"producer_group": group, "topic": topic,
                                                   "message": {"body": "orphan"}}).json()
    other = Producer(b, group, cluster.workdir, "--outbox", str(db), "--serve", "-1")
    try:
        wait_until(lambda: state_of(b, committed) == "committed"
                   and state_of(b, orphan["message_id"]) == "rolled_back", timeout=30,
                   what="checks answered from the outbox table")
        # delivered once, and nothing more within three check intervals
        assert quiet_for(lambda: [m["message_id"] for m in delivered(b, topic, 1)],
                         3 * INTERVAL_MS / 1000, "deliveries") == [committed]
        assert pending(b, group) == []
        answers = {x["check"]: x["answer"] for x in other.lines() if "check" in x}
        assert answers[committed] == "commit" and answers[orphan["message_id"]] == "rollback"
    finally:
        other.kill()
