"""Delayed messages end to end on real processes (redis-server, broker, scheduler): every
delay level on time and never early, arbitrary delays of 1 s, 90 s (the scheduler's clock moved
forward) and 30 days (on disk, inspectable, cancellable), bad delays, and retry back-off."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.scheduler.harness import DelayCluster, run_delay_cluster, unique
from tests.support.clock import now_ms
from tests.support.procs import RedisServer
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration

STEP_MS = 200
LEVELS = " ".join(f"{STEP_MS * n}ms" for n in range(1, 19))  # 200 ms ... 3.6 s
PRECISION_MS = 1000  # the scheduler's precision goal: at most 1 s late
DAY_MS = 86_400_000
BUCKET_MS = 10_000


SMALL_BUCKETS = {"bucket_ms": str(BUCKET_MS), "preload_ms": "2000"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory,
            redis_server: RedisServer) -> Iterator[DelayCluster]:
    with run_delay_cluster(tmp_path_factory.mktemp("delays"), redis_server.url, levels=LEVELS,
                           scheduler=SMALL_BUCKETS, retry_backoff="true") as handle:
        yield handle


@pytest.fixture
def clock_cluster(tmp_path: Path, redis_server: RedisServer) -> Iterator[DelayCluster]:
    """A cluster whose scheduler clock tests may move forward (it never moves back)."""
    with run_delay_cluster(tmp_path, redis_server.url,
                           scheduler={**SMALL_BUCKETS, "test_clock": "true"}) as handle:
        yield handle


def test_every_level_fires_on_time_and_never_early(cluster: DelayCluster) -> None:
    topic = cluster.broker.create_topic(queues=4)
    sent = cluster.broker.send(topic, *({"message_id": unique(f"L{n}"), "body": f"level {n}",
                                         "delay_level": n, "tag": "T", "keys": [f"k{n}"],
                                         "properties": {"level": str(n)}, "queue_id": n % 4}
                                        for n in range(1, 19)))
    assert [r["queue_id"] for r in sent] == [n % 4 for n in range(1, 19)]  # where it will go
    assert cluster.state(sent[-1]["message_id"]) == "scheduled"
    assert cluster.scheduled(topic)["by_level"]["18"] == 1
    got = wait_until(lambda: (m := cluster.pull_all(topic)) and len(m) >= 18 and m,
                     3.6 + 10, "all 18 levels")
    assert len(got) == 18
    for m in got:
        n = int(m["properties"]["level"])
        assert m["tag"] == "T" and m["keys"] == [f"k{n}"] and m["queue_id"] == n % 4
        late = m["store_timestamp_ms"] - (m["born_timestamp_ms"] + n * STEP_MS)
        assert 0 <= late < PRECISION_MS, (n, late)  # due = accepted + level
        assert cluster.state(m["message_id"]) == "stored"
    # a level message is inspectable and cancellable until it fires
    mid, after = unique("lc"), unique("after")
    cluster.broker.send(topic, {"message_id": mid, "body": "x", "delay_level": 18})
    assert cluster.cancel(mid).json() == {"message_id": mid, "state": "cancelled"}
    assert cluster.state(mid) == "cancelled"
    # a message of the same level sent after it fires after it (a level's queue is walked in
    # order): once that one is delivered, the cancelled one would have been
    cluster.broker.send(topic, {"message_id": after, "body": "y", "delay_level": 18})
    got = wait_until(lambda: (m := cluster.pull_all(topic)) and any(
        x["message_id"] == after for x in m) and m, 18 * STEP_MS / 1000 + 10, "the later one")
    assert all(m["message_id"] != mid for m in got)


def test_arbitrary_delays_of_one_second_and_at_once(cluster: DelayCluster) -> None:
    topic = cluster.broker.create_topic(queues=2)
    before = now_ms()
    ids = [unique("t") for _ in range(4)]
    cluster.broker.send(topic,
                        {"message_id": ids[0], "body": "1s", "delay_ms": 1000, "tag": "A"},
                        {"message_id": ids[1], "body": "at", "deliver_at_ms": before + 1000},
                        {"message_id": ids[2], "body": "past", "deliver_at_ms": before - 60_000},
                        {"message_id": ids[3], "body": "zero", "delay_ms": 0})
    assert cluster.state(ids[2]) == "stored" and cluster.state(ids[3]) == "stored"  # at once
    assert cluster.state(ids[0]) == "scheduled"
    got = wait_until(lambda: (m := cluster.pull_all(topic)) and len(m) == 4 and m, 10, "4")
    by_id = {m["message_id"]: m for m in got}
    for mid in ids[:2]:
        late = by_id[mid]["store_timestamp_ms"] - (before + 1000)
        assert 0 <= late < PRECISION_MS + (by_id[mid]["born_timestamp_ms"] - before), late
    assert by_id[ids[0]]["tag"] == "A" and by_id[ids[0]]["body"] == "1s"
    assert cluster.cancel(ids[0]).status_code == 409  # too late
    resp = cluster.cancel(ids[3])  # a delay of 0 is stored at once: never a delayed message
    assert resp.status_code == 404 and resp.json()["code"] == "MESSAGE_NOT_FOUND"


def test_ninety_seconds_on_a_clock_moved_forward(clock_cluster: DelayCluster) -> None:
    cluster = clock_cluster
    topic = cluster.broker.create_topic(queues=1)
    mid = unique("t90")
    (sent,) = cluster.broker.send(topic, {"message_id": mid, "body": "90s", "delay_ms": 90_000})
    due = cluster.http.get(f"/v1/messages/{mid}").json()["born_timestamp_ms"] + 90_000
    status = wait_until(lambda: (s := cluster.status())["pending_timers"] >= 1 and s,
                        what="the timer taken in")
    assert cluster.pull_all(topic) == []
    # a 90 s timer sits in a bucket that is not in memory yet (10 s buckets, 2 s preload)
    assert due // BUCKET_MS * BUCKET_MS not in status["loaded_buckets"]
    shift = due - cluster.status()["now_ms"] - 1500  # 1.5 s before due by the scheduler's clock
    cluster.advance_clock(shift)
    # its bucket is loaded now (within the preload): in memory, and still not delivered
    wait_until(lambda: due // BUCKET_MS * BUCKET_MS in cluster.status()["loaded_buckets"],
               what="the timer's bucket loaded")
    assert cluster.pull_all(topic) == [], "delivered before its time on the scheduler's clock"
    (m,) = wait_until(lambda: cluster.pull_all(topic), 5, "the 90 s timer")
    offset = cluster.status()["clock_offset_ms"]
    late = m["store_timestamp_ms"] + offset - due  # judged by the scheduler's clock
    assert 0 <= late < PRECISION_MS, late
    assert sent["queue_offset"] is None and m["message_id"] == mid  # no position until due


def test_thirty_days_on_disk_inspectable_and_cancellable(cluster: DelayCluster) -> None:
    topic = cluster.broker.create_topic(queues=2)
    mid = unique("t30d")
    at = now_ms() + 30 * DAY_MS - 60_000
    cluster.broker.send(topic, {"message_id": mid, "body": "far", "deliver_at_ms": at})
    assert cluster.state(mid) == "scheduled"
    shown = cluster.http.get(f"/v1/messages/{mid}").json()
    assert shown["topic"] == topic and shown["body"] == "far"
    view = wait_until(lambda: (v := cluster.scheduled(topic)) and v["timers"] == 1 and v, 5,
                      "the timer to be counted")
    assert view["pending"] == 1 and view["next_due_ms"] == at
    # indexed on disk under its bucket, and not in memory
    wait_until(lambda: cluster.status()["pending_timers"] >= 1, 5, "the timer taken in")
    data_dir = Path(cluster.scheduler.env["TIDEMQ_SCHEDULER_DATA_DIR"])
    bucket = (at // BUCKET_MS) * BUCKET_MS
    assert (data_dir / "buckets" / f"{bucket:020d}.idx").stat().st_size == 28
    assert bucket not in cluster.status()["loaded_buckets"]
    resp = cluster.cancel(mid)
    assert resp.status_code == 200 and resp.json() == {"message_id": mid, "state": "cancelled"}
    assert cluster.cancel(mid).json()["state"] == "cancelled"  # idempotent
    assert cluster.state(mid) == "cancelled"
    assert cluster.scheduled(topic)["pending"] == 0
    # past the maximum: refused, naming the limit
    resp = cluster.http.post(f"/v1/topics/{topic}/messages", json={"messages": [
        {"body": "x", "deliver_at_ms": now_ms() + 30 * DAY_MS + 60_000}]})
    assert resp.status_code == 400 and resp.json()["code"] == "INVALID_DELAY"
    assert str(30 * DAY_MS) in resp.json()["message"]


@pytest.mark.parametrize("fields", [
    {"delay_ms": -1}, {"delay_ms": 30 * DAY_MS + 1}, {"deliver_at_ms": -5},
    {"delay_level": 19}, {"delay_level": -2}, {"delay_level": 2, "delay_ms": 5000},
    {"delay_ms": 5000, "deliver_at_ms": 1}, {"delay_ms": "soon"},
])
def test_bad_delays_are_refused(cluster: DelayCluster, fields: dict[str, object]) -> None:
    topic = cluster.broker.create_topic(queues=1)
    resp = cluster.http.post(f"/v1/topics/{topic}/messages",
                             json={"messages": [{"body": "ok"}, {"body": "bad", **fields}]})
    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] in ("INVALID_DELAY", "BAD_REQUEST")
    if fields != {"delay_ms": "soon"}:
        assert resp.json()["code"] == "INVALID_DELAY"
    assert cluster.pull_all(topic) == []  # the batch is refused as a whole


def test_cancel_errors(cluster: DelayCluster) -> None:
    resp = cluster.cancel(unique("never-sent"))
    assert resp.status_code == 404 and resp.json()["code"] == "MESSAGE_NOT_FOUND"


def test_retry_backs_off_by_delay_level(cluster: DelayCluster) -> None:
    topic = cluster.broker.create_topic(queues=1)
    group = unique("G")
    mid = unique("r")
    cluster.broker.send(topic, {"message_id": mid, "body": "fail", "tag": "T"})
    path = f"/v1/groups/{group}/retry"
    began = now_ms()
    assert cluster.http.post(path, json={"message_id": mid}).json() == {
        "destination": f"%RETRY%{group}"}
    shown = cluster.http.get(f"/v1/messages/{mid}").json()  # the original, with its history
    assert shown["state"] == "stored" and shown["topic"] == topic
    [copy] = shown["retries"][0]["copies"]
    assert copy["state"] == "scheduled"  # waiting at level 3 (600 ms here)
    (m,) = wait_until(lambda: cluster.pull_all(f"%RETRY%{group}"), 5, "the retry")
    assert m["reconsume_times"] == 1 and m["origin_topic"] == topic and m["tag"] == "T"
    assert m["store_timestamp_ms"] - began >= 3 * STEP_MS
    assert cluster.http.post(path, json={"message_id": mid}).status_code == 200
    got = wait_until(lambda: (r := cluster.pull_all(f"%RETRY%{group}")) and len(r) == 2 and r,
                     5, "the second retry")  # level 4 this time
    assert [x["reconsume_times"] for x in got] == [1, 2]
    assert got[1]["store_timestamp_ms"] - got[0]["store_timestamp_ms"] >= 4 * STEP_MS
    resp = cluster.http.post(path, json={"message_id": mid, "delay_level": 19})
    assert resp.status_code == 400 and resp.json()["code"] == "INVALID_DELAY"


def test_cli_delay_list_and_cancel(cluster: DelayCluster) -> None:
    from typer.testing import CliRunner

    from tidemq_server.cli import app

    topic = cluster.broker.create_topic(queues=1)
    mid = unique("cli")
    cluster.broker.send(topic, {"message_id": mid, "body": "x", "delay_ms": 3_600_000},
                        {"body": "y", "delay_level": 18})
    runner = CliRunner()
    base = ["--broker", cluster.broker.url]
    wait_until(lambda: cluster.scheduled(topic)["pending"] == 2, 5, "both counted")
    listed = runner.invoke(app, [*base, "delay", "list", "--topic", topic, "--json"])
    assert listed.exit_code == 0, listed.output
    answer = json.loads(listed.stdout)
    assert answer["pending"] == 2 and answer["timers"] == 1 and answer["by_level"]["18"] == 1
    table = runner.invoke(app, [*base, "delay", "list"], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "level 18" in table.stdout
    cancelled = runner.invoke(app, [*base, "delay", "cancel", mid])
    assert cancelled.exit_code == 0 and "cancelled" in cancelled.stdout
    missing = runner.invoke(app, [*base, "delay", "cancel", unique("nope")])
    assert missing.exit_code == 3 and "MESSAGE_NOT_FOUND" in missing.output
