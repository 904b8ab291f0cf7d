"""Checks on time: with the check interval at 30 s, a half message nobody ends is checked
within a second of its own immunity, however long ago the checker's last scan was."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.procs import RedisServer
from tests.support.transactions import Producer, run_broker, run_checker, unique
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration

IMMUNITY_S = 2.0
LATE_S = 1.0  # the goal: checked at most this long after the immunity is over


def test_a_half_is_checked_at_its_immunity_not_at_the_next_interval(
        tmp_path: Path, redis_server: RedisServer) -> None:
    with run_broker(tmp_path, redis_server.url) as b, \
            run_checker(tmp_path, b, redis_server.url, check_interval_ms=30_000,
                        transaction_timeout_ms=6_000) as checker:
        topic, group = b.create_topic(queues=1), unique("G")
        answerer = Producer(b, group, tmp_path, "--check", "commit", "--serve", "-1")
        try:
            answerer.wait_for(lambda ls: any(x.get("ready") for x in ls))
            checker.scan()  # a scan just ran: the next one by the interval is 30 s away
            # two halves in turn: the second arrives after the scan that checked the first
            for i in range(2):
                born = time.time()
                resp = b.http.post("/v1/transactions", json={
                    "producer_group": group, "topic": topic, "check_immunity_s": IMMUNITY_S,
                    "messages": [{"body": f"orphan-{i}"}]})
                assert resp.status_code == 200, resp.text
                wait_until(lambda n=i: len(checks(answerer)) > n, timeout=IMMUNITY_S + 10,
                           what=f"the check of half {i}")
                at = checks(answerer)[i]["at"]
                assert IMMUNITY_S <= at - born <= IMMUNITY_S + LATE_S, at - born
            wait_until(lambda: len(b.pull(topic, 0)["messages"]) == 2, what="both committed")
        finally:
            answerer.kill()


def checks(p: Producer) -> list[dict]:
    return [line for line in p.lines() if "check" in line]
