"""Cancels of pending long timers while they roll, on real processes: the scheduler rolls every
timer back into the intake topic a few times a second, and cancels sent meanwhile (the broker's
index may not show the newest copy yet) each answer 200; none of the cancelled timers fires."""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.scheduler.harness import DelayCluster, run_delay_cluster, unique
from tests.support.clock import now_ms
from tests.support.procs import RedisServer
from tests.support.wait import quiet_for, wait_until

pytestmark = pytest.mark.integration

DAY_MS = 86_400_000
TIMERS = 400
# every timer rolls again once its copy is this old (ms); passes this often (ms)
SCHEDULER = {"bucket_ms": "3600000", "preload_ms": "1000", "test_clock": "true",
             "roll_after_ms": "300", "roll_interval_ms": "100"}
ROUNDS = 8  # cancels are sent in this many rounds, spread over the rolls
QUIET_S = 1.0  # after the clock jump, no delivery for this long (s)


def rolled(cluster: DelayCluster) -> float:
    text = cluster.sched.get("/metrics").text
    line = next(x for x in text.splitlines() if x.startswith("tidemq_scheduler_rolled_total "))
    return float(line.split()[1])


def test_cancels_of_rolling_timers_are_all_decided(
        tmp_path: Path, redis_server: RedisServer) -> None:
    with run_delay_cluster(tmp_path, redis_server.url, scheduler=SCHEDULER) as cluster:
        topic = cluster.broker.create_topic(queues=2)
        at = now_ms() + DAY_MS
        ids = [unique("c") for _ in range(TIMERS)]
        for k in range(0, TIMERS, 200):
            cluster.broker.send(topic, *({"message_id": m, "body": m, "deliver_at_ms": at + i}
                                         for i, m in enumerate(ids[k:k + 200], k)))
        wait_until(lambda: rolled(cluster) >= 2 * TIMERS, 20, "every timer rolled twice")
        before = rolled(cluster)
        answers: list[tuple[str, int, str]] = []
        per_round = TIMERS // ROUNDS
        with ThreadPoolExecutor(8) as pool:
            for r in range(ROUNDS):
                part = ids[r * per_round:(r + 1) * per_round]
                answers += [(m, a.status_code, a.text)
                            for m, a in zip(part, pool.map(cluster.cancel, part), strict=True)]
                time.sleep(0.1)  # the next round meets other rolls
        statuses = Counter(s for _, s, _ in answers)
        assert [a for a in answers if a[1] != 200] == [], statuses
        assert rolled(cluster) > before  # rolls went on meanwhile
        wait_until(lambda: cluster.status()["pending_timers"] == 0, 10, "no pending timer")
        assert {cluster.state(m) for m in ids[::37]} == {"cancelled"}
        cluster.advance_clock(DAY_MS + 60_000)
        quiet_for(lambda: len(cluster.pull_all(topic)), QUIET_S, "deliveries")
        assert cluster.pull_all(topic) == []
