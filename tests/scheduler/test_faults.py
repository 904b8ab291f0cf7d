"""Delayed delivery under faults, on real processes: the scheduler SIGKILLed and restarted
again and again, the broker SIGKILLed and restarted, and cancels racing deliveries. Every
timer must be delivered exactly once and never early, or cancelled and never delivered."""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.scheduler.harness import DelayCluster, run_delay_cluster, unique
from tests.support.clock import now_ms
from tests.support.procs import RedisServer
from tests.support.wait import quiet_for, wait_until

pytestmark = pytest.mark.integration

LEVELS = "1s 2s 3s"
SMALL_BUCKETS = {"bucket_ms": "5000", "preload_ms": "1000"}
# once the expected deliveries are in, no more (no duplicate, nothing early) for this long (s)
QUIET_S = 1.0
RETENTION_AGE_S = 1.8  # file_reserved_hours of the retention test (0.0005 h)
RETENTION_PASS_S = 0.3  # its retention_interval_s


@pytest.fixture
def cluster(tmp_path: Path, redis_server: RedisServer) -> Iterator[DelayCluster]:
    with run_delay_cluster(tmp_path, redis_server.url, levels=LEVELS,
                           scheduler=SMALL_BUCKETS) as handle:
        yield handle


def send_load(cluster: DelayCluster, topic: str, timers: int, levels: int, start_ms: int,
              spread_ms: int) -> dict[str, int]:
    """Timers due evenly over [start, start + spread) and level messages; id → due time."""
    due: dict[str, int] = {}
    batch: list[dict[str, Any]] = []
    for i in range(timers):
        mid, at = unique("k"), start_ms + spread_ms * i // timers
        due[mid] = at
        batch.append({"message_id": mid, "body": f"t{i}", "deliver_at_ms": at})
    for i in range(levels):
        mid, level = unique("l"), 1 + i % 3
        due[mid] = -level  # level n: resolved from the time the broker accepted it
        batch.append({"message_id": mid, "body": f"l{i}", "delay_level": level})
    for k in range(0, len(batch), 500):
        cluster.broker.send(topic, *batch[k:k + 500])
    return due


def check_exactly_once(cluster: DelayCluster, topic: str, due: dict[str, int],
                       cancelled: set[str] | None = None, timeout: float = 40) -> None:
    cancelled = cancelled or set()
    want = len(due) - len(cancelled)
    wait_until(lambda: len(cluster.pull_all(topic)) >= want, timeout, f"{want} deliveries")
    # nothing more arrives: no duplicates come late (twenty 50 ms ticks, five checkpoints)
    quiet_for(lambda: len(cluster.pull_all(topic)), QUIET_S, "deliveries")
    got = cluster.pull_all(topic)
    counts = Counter(m["message_id"] for m in got)
    assert [mid for mid, n in counts.items() if n > 1] == []
    assert set(counts) == set(due) - cancelled
    for m in got:
        at = due[m["message_id"]]
        if at < 0:  # level n: due at the time the broker accepted it plus n seconds
            at = m["born_timestamp_ms"] + 1000 * -at
        assert m["store_timestamp_ms"] >= at, ("early", m["message_id"], at)


def test_scheduler_killed_again_and_again(cluster: DelayCluster) -> None:
    topic = cluster.broker.create_topic(queues=4)
    due = send_load(cluster, topic, timers=4000, levels=300, start_ms=now_ms() + 1500,
                    spread_ms=9000)
    rng = random.Random(7)
    for _ in range(5):
        time.sleep(rng.uniform(0.6, 1.6))
        cluster.restart_scheduler(signal.SIGKILL)
    assert cluster.status()["pending_timers"] + len(cluster.pull_all(topic)) > 0
    check_exactly_once(cluster, topic, due)


def test_broker_killed_and_restarted(cluster: DelayCluster) -> None:
    topic = cluster.broker.create_topic(queues=4)
    due = send_load(cluster, topic, timers=3000, levels=300, start_ms=now_ms() + 1000,
                    spread_ms=7000)
    for pause in (1.5, 2.0):
        time.sleep(pause)
        cluster.broker.restart(signal.SIGKILL)
    check_exactly_once(cluster, topic, due)


def _cancel_all(cluster: DelayCluster, ids: list[str]) -> dict[str, int]:
    """Cancel from 8 threads; a 503 (a delivery of it in flight) is asked again."""
    def one(mid: str) -> int:
        while True:
            status = http.delete(f"/v1/messages/{mid}/schedule").status_code
            if status != 503:
                return status
            time.sleep(0.05)

    limits = httpx.Limits(max_connections=8)
    with httpx.Client(base_url=cluster.broker.url, timeout=30, limits=limits) as http, \
            ThreadPoolExecutor(8) as pool:
        return dict(zip(ids, pool.map(one, ids), strict=True))


def test_cancel_races_delivery(cluster: DelayCluster) -> None:
    topic = cluster.broker.create_topic(queues=2)
    at = now_ms() + 2500
    ids = [unique("c") for _ in range(600)]
    cluster.broker.send(topic, *({"message_id": m, "body": "x", "deliver_at_ms": at}
                                 for m in ids[:300]))
    cluster.broker.send(topic, *({"message_id": m, "body": "x", "deliver_at_ms": at + 5}
                                 for m in ids[300:]))
    levels = [unique("cl") for _ in range(200)]  # level 3: due about 0.5 s after the timers
    cluster.broker.send(topic, *({"message_id": m, "body": "x", "delay_level": 3}
                                 for m in levels))
    order = ids + levels
    random.Random(3).shuffle(order)
    time.sleep(max(0.0, (at - now_ms() - 300) / 1000))
    outcome = _cancel_all(cluster, order)  # from just before the timers are due until after
    assert set(outcome.values()) <= {200, 409}, Counter(outcome.values())
    cancelled = {m for m, status in outcome.items() if status == 200}
    print("cancel outcomes:", Counter(outcome.values()))  # shown with -s: both sides usually
    due = dict.fromkeys(ids[:300], at) | dict.fromkeys(ids[300:], at + 5) | \
        dict.fromkeys(levels, -3)
    check_exactly_once(cluster, topic, due, cancelled)
    for mid in random.Random(1).sample(order, 40):
        assert cluster.state(mid) == ("cancelled" if mid in cancelled else "stored")


def test_cancel_right_after_send_wins(cluster: DelayCluster) -> None:
    topic = cluster.broker.create_topic(queues=2)
    ids = [unique("e") for _ in range(300)]
    # Due well after the 300 cancels end even on a loaded machine (with 3 s, cancels still
    # running at the due time were answered 409 ALREADY_DELIVERED): every cancel races the
    # scheduler's intake, never the delivery.
    delay_s = 10.0
    began = time.monotonic()
    cluster.broker.send(topic, *({"message_id": m, "body": "x", "delay_ms": int(delay_s * 1000)}
                                 for m in ids))
    outcome = _cancel_all(cluster, ids)  # most before the scheduler took them in
    assert time.monotonic() - began < delay_s, "the cancels did not end before the due time"
    assert set(outcome.values()) == {200}
    cluster.restart_scheduler(signal.SIGKILL)  # early cancels are durable
    time.sleep(max(0.0, delay_s + 0.5 - (time.monotonic() - began)))
    assert cluster.pull_all(topic) == []
    assert cluster.scheduled(topic)["pending"] == 0


def test_retention_keeps_timers_the_scheduler_has_not_taken(
        tmp_path: Path, redis_server: RedisServer) -> None:
    retention = {"segment_bytes": str(256 * 1024),
                 "file_reserved_hours": str(RETENTION_AGE_S / 3600),
                 "retention_interval_s": str(RETENTION_PASS_S)}
    with run_delay_cluster(tmp_path, redis_server.url, levels=LEVELS, scheduler=SMALL_BUCKETS,
                           **retention) as cluster:
        broker = cluster.broker
        filler = broker.create_topic(queues=1)
        topic = broker.create_topic(queues=2)
        big = "f" * 4000
        for _ in range(4):  # a few segments of old data before the timers
            broker.send(filler, *({"body": big} for _ in range(50)))
        time.sleep(0.6)  # the scheduler reports it has nothing to keep (every 200 ms here)
        cluster.scheduler.kill()
        due = send_load(cluster, topic, timers=300, levels=30, start_ms=now_ms() + 2000,
                        spread_ms=1000)
        sent = time.monotonic()
        for _ in range(4):  # and after them
            broker.send(filler, *({"body": big} for _ in range(50)))

        def store_min() -> int:
            text = broker.http.get("/metrics").text
            line = next(x for x in text.splitlines()
                        if x.startswith("tidemq_broker_store_commitlog_min_offset "))
            return int(float(line.split()[1]))

        wait_until(lambda: store_min() > 0, 15, "retention to delete the oldest segments")
        # the timers' segments are past the retention age now (and two retention passes), held
        time.sleep(max(0.0, sent + RETENTION_AGE_S + 2 * RETENTION_PASS_S - time.monotonic()))
        intake = broker.http.get("/v1/topics/TIDE_SYS_TIMER_INTAKE").json()["offsets"][0]
        assert intake["min"] == 0 and intake["max"] == 300
        cluster.scheduler.start()
        cluster.wait_ready()
        check_exactly_once(cluster, topic, due)
        # taken in: the scheduler's floor moves on and the held segments may go
        wait_until(lambda: broker.http.get("/v1/topics/TIDE_SYS_TIMER_INTAKE").json()
                   ["offsets"][0]["min"] == 300 or store_min() > 1024 * 1024, 15,
                   "retention to move past the timers once taken in")
