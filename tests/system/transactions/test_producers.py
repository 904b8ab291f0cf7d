"""End to end with producers in their own processes: commit, rollback, unknown → check, a killed
producer's transactions answered by another instance of the group, 15 unknowns → discarded."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.support.transactions import (
    INTERVAL_MS,
    Cluster,
    Producer,
    delivered,
    events,
    pending,
    state_of,
    unique,
)
from tests.support.wait import quiet_for, wait_until

pytestmark = pytest.mark.integration

QUIET_S = 3 * INTERVAL_MS / 1000  # no more deliveries within three check intervals (s)

EVENT_KEYS = {"event", "source", "producer_group", "topic", "transaction_id", "message_id",
              "check_times", "born_ms", "ts_ms"}


def sent_of(lines: list[dict]) -> list[dict]:
    return [line["sent"] for line in lines if "sent" in line]


def done(lines: list[dict]) -> bool:
    return any(line.get("done") for line in lines)


def test_commit_delivers_exactly_once(cluster: Cluster) -> None:
    b = cluster.broker
    topic, group = b.create_topic(queues=2), unique("G")
    p = Producer(b, group, cluster.workdir, "--topic", topic, "--count", "6",
                 "--execute", "commit")
    sent = sent_of(p.wait_for(done))
    assert p.stop() == 0, p.stderr()
    assert [s["local_state"] for s in sent] == ["commit"] * 6
    wait_until(lambda: len(delivered(b, topic, 2)) >= 6, what="delivery")
    quiet_for(lambda: len(delivered(b, topic, 2)), QUIET_S, "deliveries")  # nothing more
    got = delivered(b, topic, 2)
    assert sorted(m["message_id"] for m in got) == sorted(s["message_id"] for s in sent)
    assert sorted(m["body"] for m in got) == [f"m-{i}" for i in range(6)]
    assert all(m["properties"] == {} and m["keys"] for m in got)  # internals stay hidden
    assert {state_of(b, s["message_id"]) for s in sent} == {"committed"}
    assert pending(b, group) == []
    mine = [e for e in events(b) if e["producer_group"] == group]
    assert all(set(e) == EVENT_KEYS for e in mine)
    assert Counter(e["event"] for e in mine) == {"half": 6, "commit": 6}
    assert {e["source"] for e in mine} == {"producer"}
    commit = next(e for e in mine if e["event"] == "commit")
    assert commit["topic"] == topic and commit["check_times"] == 0
    assert commit["ts_ms"] >= commit["born_ms"] > 0


def test_rollback_never_delivers(cluster: Cluster) -> None:
    b = cluster.broker
    topic, group = b.create_topic(queues=2), unique("G")
    p = Producer(b, group, cluster.workdir, "--topic", topic, "--count", "4",
                 "--execute", "rollback", "--check", "commit", "--serve", "1.5")
    sent = sent_of(p.wait_for(done))
    assert p.stop() == 0, p.stderr()
    assert delivered(b, topic, 2) == []
    assert {state_of(b, s["message_id"]) for s in sent} == {"rolled_back"}
    assert not [line for line in p.lines() if "check" in line]  # a rolled-back one is not checked
    assert pending(b, group) == []


def test_unknown_is_checked_and_the_answer_decides(cluster: Cluster) -> None:
    b = cluster.broker
    topic = b.create_topic(queues=2)
    yes, no = unique("G"), unique("G")
    # "raise": execute_local_transaction raises, which must count as UNKNOWN, not as lost
    p_yes = Producer(b, yes, cluster.workdir, "--topic", topic, "--count", "3", "--body", "yes",
                     "--execute", "raise", "--check", "commit", "--serve", "-1")
    p_no = Producer(b, no, cluster.workdir, "--topic", topic, "--count", "3", "--body", "no",
                    "--execute", "unknown", "--check", "rollback", "--serve", "-1")
    try:
        yes_sent, no_sent = sent_of(p_yes.wait_for(done)), sent_of(p_no.wait_for(done))
        assert {s["local_state"] for s in yes_sent} == {"unknown"}
        assert all("blew up" in s["error"] for s in yes_sent)
        wait_until(lambda: {state_of(b, s["message_id"]) for s in yes_sent + no_sent}
                   == {"committed", "rolled_back"} and not pending(b, yes) + pending(b, no),
                   what="checks resolving both groups")
        assert quiet_for(lambda: sorted(m["body"] for m in delivered(b, topic, 2)), QUIET_S,
                         "deliveries") == ["yes-0", "yes-1", "yes-2"]
        assert {state_of(b, s["message_id"]) for s in no_sent} == {"rolled_back"}
        evs = [e for e in events(b) if e["producer_group"] in (yes, no)]
        ends = [(e["producer_group"], e["event"], e["source"]) for e in evs
                if e["event"] in ("commit", "rollback")]
        assert Counter(ends) == {(yes, "commit", "check"): 3, (no, "rollback", "check"): 3}
        assert Counter(e["event"] for e in evs if e["event"] == "unknown") == {"unknown": 6}
        assert all(e["check_times"] >= 1 for e in evs if e["event"] == "check")
    finally:
        p_yes.kill()
        p_no.kill()


def test_another_instance_answers_when_the_producer_died(cluster: Cluster) -> None:
    b = cluster.broker
    topic, group = b.create_topic(queues=2), unique("G")
    first = Producer(b, group, cluster.workdir, "--topic", topic, "--count", "3",
                     "--execute", "unknown", "--check", "commit", "--immunity", "2",
                     "--serve", "-1")
    sent = sent_of(first.wait_for(done))
    first.kill()  # before its first check (check_immunity_s=2)
    assert not [line for line in first.lines() if "check" in line]
    assert len(pending(b, group)) == 3
    second = Producer(b, group, cluster.workdir, "--serve", "-1", "--check", "commit")
    try:
        second.wait_for(lambda ls: len([x for x in ls if "check" in x]) >= 3, timeout=30)
        wait_until(lambda: len(delivered(b, topic, 2)) == 3, what="delivery")
        quiet_for(lambda: len(delivered(b, topic, 2)), QUIET_S, "deliveries")  # nothing more
        got = delivered(b, topic, 2)
        assert sorted(m["message_id"] for m in got) == sorted(s["message_id"] for s in sent)
        assert pending(b, group) == []
    finally:
        second.kill()


def test_fifteen_unknown_answers_discard_the_message(cluster: Cluster) -> None:
    b = cluster.broker
    topic, group = b.create_topic(queues=1), unique("G")
    p = Producer(b, group, cluster.workdir, "--topic", topic, "--count", "1",
                 "--execute", "unknown", "--check", "unknown", "--serve", "-1")
    try:
        [sent] = sent_of(p.wait_for(done))
        mid, txid = sent["message_id"], sent["transaction_id"]
        wait_until(lambda: state_of(b, mid) == "discarded", timeout=40, what="discard")
        checks = [line for line in p.lines() if line.get("check") == mid]
        assert len(checks) == 15  # the 15th check is sent; the next scan discards
        assert delivered(b, topic, 1) == []
        kept = b.pull("TRANS_CHECK_MAX_TIME_TOPIC", 0, max=1024)["messages"]
        assert [m["body"] for m in kept if m["message_id"] == mid] == ["m-0"]
        mine = [e for e in events(b) if e["transaction_id"] == txid]
        assert [e["check_times"] for e in mine if e["event"] == "check"] == list(range(1, 16))
        assert [(e["event"], e["source"], e["check_times"]) for e in mine
                if e["event"] == "discard"] == [("discard", "check", 15)]
        assert pending(b, group) == []
        resp = b.http.post(f"/v1/transactions/{txid}/end", json={"producer_group": group,
                                                                  "action": "commit"})
        b.error(resp, 409, "TRANSACTION_ALREADY_ENDED")
    finally:
        p.kill()
