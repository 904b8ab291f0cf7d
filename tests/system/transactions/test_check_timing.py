"""Checks on time: with the check interval at 30 s, a half message nobody ends is checked at its
own immunity, not at the checker's next scan. How late after the immunity is bench/transactions.py's
figure (orphaned half checked after its immunity, p50/p99)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.procs import RedisServer
from tests.support.transactions import Producer, run_broker, run_checker, unique
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration

IMMUNITY_S = 2.0
INTERVAL_S = 30.0  # the checker's scan interval: a check waiting for a scan comes this late


def test_a_half_is_checked_at_its_immunity_not_at_the_next_interval(
        tmp_path: Path, redis_server: RedisServer) -> None:
    with run_broker(tmp_path, redis_server.url) as b, \
            run_checker(tmp_path, b, redis_server.url, check_interval_ms=int(INTERVAL_S * 1000),
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
                wait_until(lambda n=i: len(checks(answerer)) > n, timeout=INTERVAL_S / 2,
                           what=f"the check of half {i}")
                at = checks(answerer)[i]["at"]
                # not before its immunity; well before a scan by the interval could have come
                assert IMMUNITY_S <= at - born < INTERVAL_S / 2, at - born
            wait_until(lambda: len(b.pull(topic, 0)["messages"]) == 2, what="both committed")
        finally:
            answerer.kill()


def checks(p: Producer) -> list[dict]:
    return [line for line in p.lines() if "check" in line]
