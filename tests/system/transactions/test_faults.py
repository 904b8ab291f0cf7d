"""Faults: the checker killed mid-scan and restarted, the broker restarted with pending half
messages, and the broker switch that refuses transactional messages."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.support.clock import now_ms
from tests.support.procs import RedisServer
from tests.support.transactions import (
    INTERVAL_MS,
    TOKEN,
    Producer,
    checker_process,
    delivered,
    events,
    pending,
    run_broker,
    run_checker,
    state_of,
    unique,
)
from tests.support.wait import quiet_for, wait_until

pytestmark = pytest.mark.integration


IMMUNITY_MS = 3000  # the checker's transaction timeout in the mid-scan kill test


def checks_seen(p: Producer) -> list[str]:
    return [line["check"] for line in p.lines() if "check" in line]


def test_checker_killed_mid_scan_misses_nothing_and_duplicates_nothing(
        tmp_path: Path, redis_server: RedisServer) -> None:
    count = 240
    with run_broker(tmp_path, redis_server.url) as b:
        topic, group = b.create_topic(queues=2), unique("G")
        resp = b.http.post("/v1/transactions", json={
            "producer_group": group, "topic": topic,
            "messages": [{"body": f"k{i}"} for i in range(count)]})
        assert resp.status_code == 200, resp.text
        txids = {t["transaction_id"] for t in resp.json()["transactions"]}
        answerer = Producer(b, group, tmp_path, "--check", "commit", "--serve", "-1")
        try:
            answerer.wait_for(lambda ls: any(x.get("ready") for x in ls))
            # every half is past the immunity (by its store time): one scan checks all of them
            entries = b.http.get("/internal/v1/transactions/halves", params={"max": 256},
                                 headers={"X-Tidemq-Token": TOKEN}).json()["entries"]
            due = max(e["store_timestamp_ms"] for e in entries
                      if e["transaction_id"] in txids) + IMMUNITY_MS
            wait_until(lambda: now_ms() >= due, what="every half due")
            # small pages, so that a scan is many requests and the kill lands inside one
            proc = checker_process(tmp_path, b, redis_server.url, batch_size=3,
                                   check_interval_ms=200, transaction_timeout_ms=IMMUNITY_MS)
            proc.start()
            wait_until(lambda: len(checks_seen(answerer)) >= 10, what="first checks")
            proc.kill()
            at_kill = len(checks_seen(answerer))
            proc.start()
            wait_until(lambda: len(delivered(b, topic, 2)) >= count, timeout=60,
                       what="every message delivered")
            # nothing more: no second delivery, no second check, for five check intervals
            quiet_for(lambda: (len(delivered(b, topic, 2)), len(checks_seen(answerer))),
                      5 * 0.2, "deliveries and checks")
            proc.stop()
            got = delivered(b, topic, 2)
            assert len(got) == count and len({m["message_id"] for m in got}) == count
            assert pending(b, group) == []
            mine = [e for e in events(b) if e["transaction_id"] in txids]
            per_tx = Counter(e["transaction_id"] for e in mine if e["event"] == "check")
            assert set(per_tx) == txids  # nobody missed
            assert set(per_tx.values()) == {1}  # nobody checked twice, the restart included
            assert at_kill < count, "the kill came after the scan; nothing was tested"
        finally:
            answerer.kill()


def test_broker_restart_keeps_pending_transactions_checked(
        tmp_path: Path, redis_server: RedisServer) -> None:
    with run_broker(tmp_path, redis_server.url) as b:
        topic, group = b.create_topic(queues=2), unique("G")
        first = Producer(b, group, tmp_path, "--topic", topic, "--count", "4",
                         "--execute", "unknown", "--check", "unknown", "--serve", "-1")
        with run_checker(tmp_path, b, redis_server.url):
            sent = [x["sent"] for x in first.wait_for(
                lambda ls: any(x.get("done") for x in ls)) if "sent" in x]
            wait_until(lambda: len(set(checks_seen(first))) == 4, what="a first check each")
            first.kill()
            b.restart(signal.SIGKILL)
            listed = {p["transaction_id"]: p for p in pending(b, group)}
            assert set(listed) == {s["transaction_id"] for s in sent}
            assert all(p["check_times"] >= 1 for p in listed.values())
            assert {state_of(b, s["message_id"]) for s in sent} == {"half"}
            second = Producer(b, group, tmp_path, "--check", "commit", "--serve", "-1")
            try:
                wait_until(lambda: len(delivered(b, topic, 2)) == 4, timeout=30,
                           what="delivery after the restart")
                # nothing more within three check intervals
                quiet_for(lambda: len(delivered(b, topic, 2)), 3 * INTERVAL_MS / 1000,
                          "deliveries")
                got = delivered(b, topic, 2)
                assert sorted(m["message_id"] for m in got) == \
                    sorted(s["message_id"] for s in sent)
                assert pending(b, group) == []
            finally:
                second.kill()


def test_commit_after_a_torn_tail_is_not_delivered_twice(
        tmp_path: Path, redis_server: RedisServer) -> None:
    """A commit copy without its op record (a crash tore the tail between them): after a
    restart the transaction counts as committed and a repeated commit stores nothing."""
    with run_broker(tmp_path, redis_server.url) as b:
        topic, group = b.create_topic(queues=1), unique("G")
        resp = b.http.post("/v1/transactions", json={"producer_group": group, "topic": topic,
                                                     "message": {"body": "torn"}})
        tx = resp.json()
        halves = b.http.get("/internal/v1/transactions/halves",
                            headers={"X-Tidemq-Token": TOKEN}).json()["entries"]
        [entry] = [e for e in halves if e["transaction_id"] == tx["transaction_id"]]
        copy = {"topic": topic, "queue_id": 0, "body": "torn", "sys_flag": 0x8,
                "properties": {"UNIQ_KEY": tx["message_id"], "TRAN_MSG": "true",
                               "PGROUP": group, "TRANSACTION_ID": tx["transaction_id"]},
                "prepared_tx_offset": entry["physical_offset"]}
        put = b.http.post(f"/internal/v1/topics/{topic}/messages", json={"records": [copy]},
                          headers={"X-Tidemq-Token": TOKEN})
        assert put.status_code == 200, put.text
        b.restart(signal.SIGKILL)
        assert state_of(b, tx["message_id"]) == "committed"
        again = b.http.post(f"/v1/transactions/{tx['transaction_id']}/end",
                            json={"producer_group": group, "action": "commit"})
        assert again.json() == {"state": "committed"}
        assert [m["body"] for m in delivered(b, topic, 1)] == ["torn"]
        b.error(b.http.post(f"/v1/transactions/{tx['transaction_id']}/end",
                            json={"producer_group": group, "action": "rollback"}),
                409, "TRANSACTION_ALREADY_ENDED")


def test_broker_switch_refuses_transactional_messages(
        tmp_path: Path, redis_server: RedisServer) -> None:
    with run_broker(tmp_path, redis_server.url, reject_transactions="true") as b:
        topic = b.create_topic(queues=1)
        resp = b.http.post("/v1/transactions", json={"producer_group": "g", "topic": topic,
                                                     "message": {"body": "x"}})
        b.error(resp, 403, "TRANSACTIONS_DISABLED")
        assert b.send(topic, {"body": "plain still works"})[0]["queue_offset"] == 0


def test_checker_health_metrics_and_token(tmp_path: Path, redis_server: RedisServer) -> None:
    with run_broker(tmp_path, redis_server.url) as b, \
            run_checker(tmp_path, b, redis_server.url) as c:
        assert c.http.get("/healthz").json() == {"status": "ok"}
        assert c.http.post("/internal/v1/scan").status_code == 401
        report = c.scan()
        assert report["half_end"] == 0 and report["checked"] == 0
        text = c.metrics()
        for name in ("tidemq_checker_scans_total", "tidemq_checker_half_offset",
                     "tidemq_checker_peak_rss_bytes", "tidemq_checker_scan_seconds_bucket"):
            assert name in text
        assert httpx.get(b.url + "/internal/v1/transactions/halves").status_code == 401
        assert "tidemq_broker_transactions_pending" in b.http.get("/metrics").text
        progress = json.dumps(report)
        assert "half_offset" in progress



def test_checks_go_to_one_live_producer_and_never_to_a_silent_one(
        tmp_path: Path, redis_server: RedisServer) -> None:
    with run_broker(tmp_path, redis_server.url, producer_expiry_s=1) as b:
        topic, group = b.create_topic(queues=1), unique("G")
        tx = b.http.post("/v1/transactions", json={"producer_group": group, "topic": topic,
                                                   "message": {"body": "c"}}).json()
        for client in ("p1", "p2"):
            assert b.http.post(f"/v1/producers/{group}/heartbeat",
                               json={"client_id": client}).json() == {}
        token = {"X-Tidemq-Token": TOKEN}
        [half] = [e for e in b.http.get("/internal/v1/transactions/halves",
                                        headers=token).json()["entries"]
                  if e["transaction_id"] == tx["transaction_id"]]
        acted = b.http.post("/internal/v1/transactions/actions", headers=token, json={
            "actions": [{"transaction_id": tx["transaction_id"], "action": "check",
                         "physical_offset": half["physical_offset"]}]}).json()["results"]
        assert [(r["outcome"], r["check_times"]) for r in acted] == [("checked", 1)]

        def poll(client: str, wait_ms: int = 0) -> list[dict]:
            resp = b.http.get(f"/v1/producers/{group}/checks",
                              params={"client_id": client, "wait_ms": wait_ms})
            assert resp.status_code == 200, resp.text
            checks: list[dict] = resp.json()["checks"]
            return checks

        assert poll("stranger") == []  # never heartbeated: not a live producer of the group
        [check] = poll("p1")
        assert (check["transaction_id"], check["message_id"], check["topic"],
                check["check_times"]) == (tx["transaction_id"], tx["message_id"], topic, 1)
        assert check["message"]["body"] == "c"
        assert poll("p1") == [] and poll("p2") == []  # handed to one poller, once
        time.sleep(1.5)  # both go silent past the producer expiry
        again = b.http.post("/internal/v1/transactions/actions", headers=token, json={
            "actions": [{"transaction_id": tx["transaction_id"], "action": "check",
                         "physical_offset": half["physical_offset"]}]}).json()["results"]
        assert again[0]["outcome"] == "superseded"  # that copy was replaced by the first check
        latest = b.http.get("/internal/v1/transactions/halves", headers=token).json()
        newest = [e for e in latest["entries"] if e["transaction_id"] == tx["transaction_id"]]
        acted = b.http.post("/internal/v1/transactions/actions", headers=token, json={
            "actions": [{"transaction_id": tx["transaction_id"], "action": "check",
                         "physical_offset": newest[-1]["physical_offset"]}]}).json()["results"]
        assert acted[0]["check_times"] == 2 and acted[0]["producer_alive"] is False
        assert poll("p1", wait_ms=300) == []  # silent for more than the expiry: nothing
        b.http.post(f"/v1/producers/{group}/heartbeat", json={"client_id": "p1"})
        assert [c["check_times"] for c in poll("p1")] == [2]  # counted while nobody was alive


def metric(text: str, name: str) -> float:
    """A sample's value in a Prometheus text page (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def test_a_restarted_checker_remembers_ended_transactions(
        tmp_path: Path, redis_server: RedisServer) -> None:
    """Two transactions ended while an older half message held the scan before them: the
    checker is killed and restarted before that one is due; it reads the ended ids again, so
    when the scan passes them they are skipped as ended, not checked once more."""
    with run_broker(tmp_path, redis_server.url) as b:
        topic, group = b.create_topic(queues=1), unique("G")
        settings = dict(transaction_timeout_ms=10_000, check_interval_ms=60_000)
        proc = checker_process(tmp_path, b, redis_server.url, **settings)
        # started first: "held" must not be due at the first scan, and a start on a loaded
        # machine took longer than its 10 s immunity
        proc.start()
        resp = b.http.post("/v1/transactions", json={
            "producer_group": group, "topic": topic,
            "messages": [{"body": "held"}, {"body": "a"}, {"body": "b"}]})
        assert resp.status_code == 200, resp.text
        _, *ended = [t["transaction_id"] for t in resp.json()["transactions"]]
        resp = b.http.post("/v1/transactions/end", json={"producer_group": group, "ends": [
            {"transaction_id": t, "action": "commit"} for t in ended]})
        assert resp.status_code == 200, resp.text
        with httpx.Client(base_url=proc.url, timeout=30) as http:
            report = http.post("/internal/v1/scan", headers={"X-Tidemq-Token": TOKEN}).json()
        assert report["stopped_early"] and report["ended"] == 0  # "held" is not due yet
        proc.kill()
        proc.start()
        try:
            with httpx.Client(base_url=proc.url, timeout=30) as http:
                # (the ids are dropped again as the scan passes their halves)
                wait_until(lambda: metric(http.get("/metrics").text,
                                          'tidemq_checker_decisions_total{decision="ended"}')
                           >= 2, timeout=40, what="the ended halves passed")
                page = http.get("/metrics").text
            assert metric(page, 'tidemq_checker_decisions_total{decision="stale"}') == 0
            assert metric(page, 'tidemq_checker_decisions_total{decision="checked"}') == 1
        finally:
            proc.stop()
