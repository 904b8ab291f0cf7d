"""Every id the send accepted is reachable, percent-encoded, on every endpoint that takes one
(real broker and scheduler): ``order/42``, ``a/b/../c``, ids ending in ``/trace`` or
``/schedule``, ids with ``%``; through REST, the CLI (``query --id``, ``delay cancel``) and the
SDK (a producer's send of such an id, a consumer's leave under a client id with ``/``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from urllib.parse import quote

import pytest
from tidemq import Message, Producer, PushConsumer
from typer.testing import CliRunner

from tests.scheduler.harness import DelayCluster, run_delay_cluster
from tests.support.broker import unique
from tests.support.procs import RedisServer
from tidemq_server.cli import app

pytestmark = pytest.mark.integration

IDS = ["order/42", "a/b/../c", "x/trace", "y/schedule", "/lead", "trail/", "50%/off", "%2F"]


def enc(message_id: str) -> str:
    return quote(message_id, safe="")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory,
            redis_server: RedisServer) -> Iterator[DelayCluster]:
    with run_delay_cluster(tmp_path_factory.mktemp("slash-ids"), redis_server.url) as c:
        yield c


@pytest.mark.parametrize("raw", IDS)
def test_get_trace_and_cancel_reach_an_id_with_slashes(cluster: DelayCluster, raw: str) -> None:
    b = cluster.broker
    topic = b.create_topic(queues=1)
    stored, delayed = f"{unique('s')}{raw}", f"{unique('d')}{raw}"
    b.send(topic, {"message_id": stored, "body": "plain"},
           {"message_id": delayed, "body": "later", "delay_ms": 3_600_000})
    got = b.http.get(f"/v1/messages/{enc(stored)}")
    assert got.status_code == 200, got.text
    assert got.json()["message_id"] == stored and got.json()["body"] == "plain"
    trace = b.http.get(f"/v1/messages/{enc(stored)}/trace")
    assert trace.status_code == 200, trace.text
    assert trace.json()["message_id"] == stored
    assert cluster.state(enc(delayed)) == "scheduled"
    cancelled = b.http.delete(f"/v1/messages/{enc(delayed)}/schedule")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["state"] == "cancelled"
    assert cluster.state(enc(delayed)) == "cancelled"


def test_an_id_ending_in_trace_is_not_the_trace_of_its_prefix(cluster: DelayCluster) -> None:
    b = cluster.broker
    topic = b.create_topic(queues=1)
    prefix = unique("p")
    b.send(topic, {"message_id": prefix, "body": "the prefix"},
           {"message_id": f"{prefix}/trace", "body": "the id ending in /trace"})
    as_id = b.http.get(f"/v1/messages/{enc(prefix + '/trace')}").json()
    assert as_id["body"] == "the id ending in /trace"
    trace_of_prefix = b.http.get(f"/v1/messages/{enc(prefix)}/trace").json()
    assert trace_of_prefix["message_id"] == prefix
    # unencoded, a "/" is a path separator: that is the prefix's trace, as documented
    assert b.http.get(f"/v1/messages/{prefix}/trace").json()["message_id"] == prefix
    resp = b.http.get(f"/v1/messages/{prefix}/no-such-part")
    assert resp.status_code == 404 and resp.json()["code"] == "NOT_FOUND"


def test_the_cli_queries_and_cancels_an_id_with_slashes(cluster: DelayCluster) -> None:
    b = cluster.broker
    topic = b.create_topic(queues=1)
    stored, delayed = f"{unique('cli')}/order/42", f"{unique('cli')}/later/schedule"
    b.send(topic, {"message_id": stored, "body": "for the cli"},
           {"message_id": delayed, "body": "x", "delay_ms": 3_600_000})
    runner = CliRunner()
    result = runner.invoke(app, ["--broker", b.url, "query", "--id", stored, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.splitlines()[0])["message_id"] == stored
    result = runner.invoke(app, ["--broker", b.url, "delay", "cancel", delayed])
    assert result.exit_code == 0, result.output
    assert cluster.state(enc(delayed)) == "cancelled"


def test_the_sdk_sends_and_leaves_with_slashes_in_ids(cluster: DelayCluster) -> None:
    b = cluster.broker
    topic, group = b.create_topic(queues=1), unique("g")
    message_id = f"{unique('sdk')}/order/42"

    async def scenario() -> list[str]:
        async with Producer(broker_url=b.url) as producer:
            await producer.send(Message(body=b"x", topic=topic, message_id=message_id))
        consumer = PushConsumer(group, handler=lambda m: None, broker_url=b.url,
                                subscriptions={topic: "*"}, client_id=f"host/{unique('c')}")
        await consumer.start()
        members = b.http.get("/v1/groups").json()["groups"]
        assert [g["members"] for g in members if g["group"] == group] == [[consumer.client_id]]
        await consumer.close()  # leaves at once: DELETE .../members/host%2F...
        listed = b.http.get("/v1/groups").json()["groups"]
        return [m for g in listed if g["group"] == group for m in g["members"] or []]

    assert asyncio.run(scenario()) == []
    assert b.http.get(f"/v1/messages/{enc(message_id)}").json()["message_id"] == message_id
