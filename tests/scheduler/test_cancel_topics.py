"""One message id pending as a delayed message in two topics, on real processes (redis-server,
broker, scheduler): a cancel names its topic (``?topic=``) and never touches the other topic's
timer; without a topic it is refused with 409 AMBIGUOUS_MESSAGE_ID while the id waits in both,
and cancels the only one left once the other is gone; a scheduler that loses its disk rebuilds
the cancel for its own topic only."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.scheduler.harness import DelayCluster, run_delay_cluster, unique
from tests.scheduler.test_rebuild import lose_disk_and_restart
from tests.support.procs import RedisServer, free_port, wait_port
from tests.support.wait import wait_until
from tidemq_server.broker.grpc.proto import Code, service_grpc, service_pb

pytestmark = pytest.mark.integration

DELAY_MS = 600_000  # ten minutes: nothing is delivered while a test runs
SCHEDULER = {"bucket_ms": "60000", "preload_ms": "1000"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory,
            redis_server: RedisServer) -> Iterator[DelayCluster]:
    port = free_port()
    with run_delay_cluster(tmp_path_factory.mktemp("cancel-topics"), redis_server.url,
                           scheduler=SCHEDULER, grpc_port=port) as handle:
        wait_port(port)
        handle.grpc_port = port  # type: ignore[attr-defined]
        yield handle


def pending(cluster: DelayCluster, topic: str) -> int:
    return int(cluster.scheduled(topic)["pending"])


def send_in(cluster: DelayCluster, mid: str, topics: list[str], **delay: int) -> None:
    for topic in topics:
        cluster.broker.send(topic, {"message_id": mid, "body": topic, **(delay or
                                                                          {"delay_ms": DELAY_MS})})
    wait_until(lambda: all(pending(cluster, t) == 1 for t in topics), 10, "both counted")


@pytest.mark.parametrize("first", ["A", "B"])
def test_a_cancel_never_takes_another_topics_timer(cluster: DelayCluster, first: str) -> None:
    a, b = cluster.broker.create_topic(queues=2), cluster.broker.create_topic(queues=2)
    mid = unique("twice")
    send_in(cluster, mid, [a, b] if first == "A" else [b, a])
    # no topic: refused, naming both, and nothing is cancelled
    resp = cluster.cancel(mid)
    assert resp.status_code == 409, resp.text
    assert resp.json()["code"] == "AMBIGUOUS_MESSAGE_ID"
    assert a in resp.json()["message"] and b in resp.json()["message"]
    assert pending(cluster, a) == 1 and pending(cluster, b) == 1
    # ?topic= cancels that topic's timer alone
    resp = cluster.cancel(mid, a)
    assert resp.status_code == 200 and resp.json() == {"message_id": mid, "state": "cancelled"}
    assert pending(cluster, a) == 0 and pending(cluster, b) == 1
    assert cluster.cancel(mid, a).json()["state"] == "cancelled"  # idempotent, still only A
    assert pending(cluster, b) == 1
    # a repeated send learns the standing of its own topic's message
    again = {"message_id": mid, "body": "again", "delay_ms": DELAY_MS}
    assert cluster.broker.send(a, again)[0]["state"] == "cancelled"
    assert cluster.broker.send(b, again)[0]["state"] == "scheduled"
    # the id now waits in B alone: a cancel without a topic is B's, as before
    resp = cluster.cancel(mid)
    assert resp.status_code == 200, resp.text
    assert pending(cluster, b) == 0


def test_level_and_timer_of_one_id(cluster: DelayCluster) -> None:
    a, b = cluster.broker.create_topic(queues=2), cluster.broker.create_topic(queues=2)
    mid = unique("mixed")
    send_in(cluster, mid, [a], delay_level=18)  # a level message (2 h by default)
    send_in(cluster, mid, [b])  # and a timer
    assert cluster.cancel(mid).json()["code"] == "AMBIGUOUS_MESSAGE_ID"
    assert cluster.cancel(mid, b).status_code == 200
    assert pending(cluster, a) == 1 and pending(cluster, b) == 0
    assert cluster.cancel(mid, a).status_code == 200
    assert pending(cluster, a) == 0


def test_topic_errors(cluster: DelayCluster) -> None:
    a, b = cluster.broker.create_topic(queues=1), cluster.broker.create_topic(queues=1)
    mid = unique("one")
    send_in(cluster, mid, [a])
    resp = cluster.cancel(mid, b)  # pending in A, never sent to B
    assert resp.status_code == 404 and resp.json()["code"] == "MESSAGE_NOT_FOUND"
    assert pending(cluster, a) == 1
    resp = cluster.cancel(mid, "bad topic!")
    assert resp.status_code == 400 and resp.json()["code"] == "INVALID_TOPIC_NAME"
    plain = unique("plain")
    cluster.broker.send(b, {"message_id": plain, "body": "now"})
    resp = cluster.cancel(plain, b)
    assert resp.status_code == 404 and "never delayed" in resp.json()["message"]


def test_cli_cancel_with_topic(cluster: DelayCluster) -> None:
    from typer.testing import CliRunner

    from tidemq_server.cli import app

    a, b = cluster.broker.create_topic(queues=1), cluster.broker.create_topic(queues=1)
    mid = unique("cli")
    send_in(cluster, mid, [a, b])
    runner = CliRunner()
    base = ["--broker", cluster.broker.url, "delay", "cancel"]
    refused = runner.invoke(app, [*base, mid])
    assert refused.exit_code == 4 and "AMBIGUOUS_MESSAGE_ID" in refused.output
    done = runner.invoke(app, [*base, mid, "--topic", b, "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout) == {"message_id": mid, "state": "cancelled"}
    assert pending(cluster, a) == 1 and pending(cluster, b) == 0


async def test_a_grpc_recall_names_its_topic(cluster: DelayCluster) -> None:
    a, b = cluster.broker.create_topic(queues=1), cluster.broker.create_topic(queues=1)
    mid = unique("recall")
    send_in(cluster, mid, [a, b])
    port = cluster.grpc_port  # type: ignore[attr-defined]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = service_grpc.MessagingServiceStub(channel)
        request = service_pb.RecallMessageRequest(recall_handle=mid)
        request.topic.name = b
        res = await stub.RecallMessage(request, metadata=(("x-mq-client-id", "recall-test"),),
                                       timeout=10)
    assert res.status.code == Code.OK, res.status
    assert pending(cluster, a) == 1 and pending(cluster, b) == 0


def test_a_rebuild_keeps_each_cancel_in_its_topic(tmp_path: Path,
                                                  redis_server: RedisServer) -> None:
    with run_delay_cluster(tmp_path, redis_server.url,
                           scheduler={**SCHEDULER, "test_clock": "true"}) as cluster:
        a, b = cluster.broker.create_topic(queues=1), cluster.broker.create_topic(queues=1)
        mid = unique("rebuilt")
        send_in(cluster, mid, [a, b])
        wait_until(lambda: cluster.status()["ingested_next"] >= 2, 10, "both taken in")
        assert cluster.cancel(mid, a).status_code == 200
        cluster.restart_scheduler()  # the cancel is on its disk
        assert pending(cluster, a) == 0 and pending(cluster, b) == 1
        lose_disk_and_restart(cluster)  # read back from the broker's cancel topic
        assert pending(cluster, a) == 0 and pending(cluster, b) == 1
        cluster.advance_clock(DELAY_MS + 60_000)
        (got,) = wait_until(lambda: cluster.pull_all(b), 10, "B's message")
        assert got["message_id"] == mid and got["body"] == b
        assert cluster.pull_all(a) == []  # A's was due first: it would be there by now
