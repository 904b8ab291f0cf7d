"""What a delayed message reports about its position, on real processes (broker + scheduler).

A delayed message has no position in its queue until it is delivered. The send result and
``GET /v1/messages/{id}`` used to show the queue offset of its waiting copy in the timer topic,
which in the user's topic belongs to another message; a repeated send of the same id answered
a different queue each time; a repeated send of a cancelled one answered as if scheduled.
Now: ``queue_offset`` null with ``state: scheduled`` and ``deliver_at_ms`` until delivery, the
real position after it, and a repeat answers the first result (saying ``cancelled`` or giving
the delivered position when that happened since). The scheduler's own endpoints answer a bad
request with a 4xx instead of a 500.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from tidemq import Producer
from typer.testing import CliRunner

from tests.scheduler.harness import DelayCluster, run_delay_cluster, unique
from tests.support.clock import now_ms
from tests.support.procs import RedisServer
from tests.support.wait import quiet_for, wait_until
from tidemq_server.cli import app

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000
WIDE = {"COLUMNS": "200"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory,
            redis_server: RedisServer) -> Iterator[DelayCluster]:
    with run_delay_cluster(tmp_path_factory.mktemp("positions"), redis_server.url) as handle:
        yield handle


def lookup(cluster: DelayCluster, mid: str) -> dict[str, Any]:
    resp = cluster.http.get(f"/v1/messages/{mid}")
    assert resp.status_code == 200, resp.text
    answer: dict[str, Any] = resp.json()
    return answer


def test_no_position_until_delivered_then_the_real_one(cluster: DelayCluster) -> None:
    topic = cluster.broker.create_topic(queues=4)
    cluster.broker.send(topic, *({"body": f"plain {i}", "queue_id": 2} for i in range(3)))
    far, near = unique("far"), unique("near")
    before = now_ms()
    r_far, r_near = cluster.broker.send(
        topic, {"message_id": far, "body": "in an hour", "queue_id": 2, "delay_ms": HOUR_MS},
        {"message_id": near, "body": "soon", "queue_id": 2, "delay_ms": 300})
    for result, delay in ((r_far, HOUR_MS), (r_near, 300)):
        assert result["queue_id"] == 2 and result["queue_offset"] is None
        assert result["state"] == "scheduled"
        assert before + delay <= result["deliver_at_ms"] <= now_ms() + delay
    shown = lookup(cluster, far)
    assert (shown["state"], shown["topic"], shown["queue_id"]) == ("scheduled", topic, 2)
    assert shown["queue_offset"] is None and shown["deliver_at_ms"] == r_far["deliver_at_ms"]

    delivered = wait_until(lambda: [m for m in cluster.pull_all(topic) if m["message_id"] == near],
                           10, "the 300 ms message")
    (copy,) = delivered
    assert (copy["queue_id"], copy["queue_offset"]) == (2, 3)  # after the 3 plain messages
    after = lookup(cluster, near)
    assert (after["state"], after["queue_id"], after["queue_offset"]) == ("stored", 2, 3)
    assert "deliver_at_ms" not in after
    # sent again after its delivery: the first result, now with the position it got
    (again,) = cluster.broker.send(topic, {"message_id": near, "body": "soon", "queue_id": 2,
                                           "delay_ms": 300})
    assert (again["state"], again["queue_id"], again["queue_offset"]) == ("stored", 2, 3)
    assert again["deliver_at_ms"] == r_near["deliver_at_ms"]
    # delivered once: no second copy within three times the repeat's own delay (300 ms)
    assert quiet_for(lambda: [m["message_id"] for m in cluster.pull_all(topic)].count(near),
                     3 * 0.3, "deliveries of the repeated message") == 1


def test_a_repeated_delayed_send_answers_the_first_result(cluster: DelayCluster) -> None:
    topic = cluster.broker.create_topic(queues=4)
    mid = unique("again")
    message = {"message_id": mid, "body": "once", "delay_ms": HOUR_MS}  # round-robin queue
    (first,) = cluster.broker.send(topic, message)
    repeats = [cluster.broker.send(topic, message)[0] for _ in range(5)]
    repeats.append(cluster.broker.send(topic, {"body": "other"}, message)[1])  # in a batch
    time.sleep(0.01)
    repeats.append(cluster.broker.send(topic, {**message, "delay_ms": HOUR_MS * 2})[0])
    assert all(r == first for r in repeats), (first, repeats)
    wait_until(lambda: cluster.scheduled(topic)["timers"] == 1, 5, "one timer")
    # stored once: no second timer is taken in through ten of the scheduler's 50 ms ticks
    assert quiet_for(lambda: cluster.scheduled(topic)["timers"], 0.5, "timers") == 1


def test_a_repeated_send_of_a_cancelled_message_says_cancelled(cluster: DelayCluster) -> None:
    topic = cluster.broker.create_topic(queues=2)
    mid = unique("gone")
    (first,) = cluster.broker.send(topic, {"message_id": mid, "body": "x", "delay_ms": HOUR_MS})
    wait_until(lambda: cluster.scheduled(topic)["pending"] == 1, 5, "the timer counted")
    assert cluster.cancel(mid).status_code == 200
    (again,) = cluster.broker.send(topic, {"message_id": mid, "body": "x", "delay_ms": HOUR_MS})
    assert again == {**first, "state": "cancelled"}
    assert cluster.scheduled(topic)["pending"] == 0  # nothing scheduled again
    shown = lookup(cluster, mid)
    assert (shown["state"], shown["queue_id"], shown["queue_offset"]) == (
        "cancelled", first["queue_id"], None)
    assert shown["deliver_at_ms"] == first["deliver_at_ms"]


async def test_the_sdk_reports_a_scheduled_message(cluster: DelayCluster) -> None:
    topic = cluster.broker.create_topic(queues=2)
    async with Producer(broker_url=cluster.broker.url) as producer:
        result = await producer.send("later", topic=topic, delay_ms=HOUR_MS)
        plain = await producer.send("now", topic=topic)
    assert result.scheduled and result.queue_offset is None and result.state == "scheduled"
    assert result.deliver_at_ms is not None and result.deliver_at_ms > now_ms() + HOUR_MS - 60_000
    assert not plain.scheduled and plain.state == "stored" and plain.queue_offset == 0


def test_the_cli_shows_a_due_time_instead_of_an_offset(cluster: DelayCluster) -> None:
    topic = cluster.broker.create_topic(queues=1)
    runner = CliRunner()
    base = ["--broker", cluster.broker.url]
    sent = runner.invoke(app, [*base, "send", topic, "later", "--delay-ms", str(HOUR_MS)],
                         env=WIDE)
    assert sent.exit_code == 0, sent.output
    assert "scheduled for" in sent.stdout and "offset None" not in sent.stdout
    as_json = runner.invoke(app, [*base, "send", topic, "later", "--delay-ms", "5000", "--json"])
    answer = json.loads(as_json.stdout)
    assert answer["queue_offset"] is None and answer["state"] == "scheduled"
    table = runner.invoke(app, [*base, "query", "--id", answer["message_id"]], env=WIDE)
    assert table.exit_code == 0, table.output
    assert "scheduled (due" in table.stdout and "0:-" in table.stdout


def test_the_scheduler_answers_bad_requests_with_4xx(cluster: DelayCluster) -> None:
    sched = cluster.sched
    for offset in (2**63, 2**64 - 1):
        resp = sched.post("/internal/v1/timers/cancel",
                          json={"message_id": unique("m"), "intake_offset": offset})
        assert resp.status_code == 400, resp.text
        assert "intake_offset" in resp.json()["message"]
    resp = sched.post("/internal/v1/timers/cancel", content=(
        '{"message_id": "m", "intake_offset": 1180591620717411303424}'),
        headers={"content-type": "application/json"})
    assert resp.status_code == 400 and resp.json()["code"] == "BAD_REQUEST", resp.text
    resp = sched.post("/internal/v1/timers/cancel",
                      json={"message_id": "m", "level": 99, "queue_offset": 0})
    assert resp.status_code == 400 and "level" in resp.json()["message"], resp.text
    # the broker refuses what the scheduler passes on (an empty topic): a 400, not a 500
    resp = sched.get("/internal/v1/scheduled", params={"topic": ""})
    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "BAD_REQUEST" and "broker refused" in resp.json()["message"]
    assert cluster.scheduler.proc is not None and cluster.scheduler.proc.poll() is None
    assert sched.get("/healthz").status_code == 200
