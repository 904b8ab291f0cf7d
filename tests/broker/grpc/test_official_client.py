"""The official RocketMQ 5 Python client against tidemq's gRPC front door, end to end.

Normal and FIFO sends, a SimpleConsumer's receive / change invisibility / ack with redelivery,
and both directions between the official client and tidemq's own REST API and SDK.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import httpx
import pytest
from tidemq import Producer, ReceivedMessage, SimpleConsumer

from tests.broker.grpc.conftest import Cluster
from tests.support.broker import unique

pytestmark = pytest.mark.integration


def pull_all(cluster: Cluster, topic: str, queues: int = 4) -> list[dict[str, Any]]:
    """Every message of a topic through the REST pull endpoint."""
    out: list[dict[str, Any]] = []
    for queue in range(queues):
        resp = cluster.http.get(f"{cluster.broker_url}/v1/topics/{topic}/queues/{queue}/messages",
                                params={"offset": 0, "max": 1024})
        assert resp.status_code == 200, resp.text
        out.extend(resp.json()["messages"])
    return out


def test_normal_send_is_readable_over_rest_and_by_the_official_consumer(
        cluster: Cluster) -> None:
    topic = cluster.topic()
    sent = cluster.client("send", "--topic", topic, "--count", 5, "--tag", "TagA",
                          "--prefix", "normal")["sent"]
    assert len({s["message_id"] for s in sent}) == 5

    pulled = {m["message_id"]: m for m in pull_all(cluster, topic)}
    assert set(pulled) == {s["message_id"] for s in sent}
    for s in sent:
        m = pulled[s["message_id"]]
        seq = s["body"].rsplit("-", 1)[1]
        assert (m["body"], m["tag"], m["keys"]) == (s["body"], "TagA", [f"key-{seq}"])
        assert m["properties"] == {"seq": seq}
        one = cluster.http.get(f"{cluster.broker_url}/v1/messages/{s['message_id']}").json()
        assert one["state"] == "stored" and one["body"] == s["body"]

    got = cluster.client("receive", "--topic", topic, "--count", 5, "--consumer-group",
                         unique("g"))["received"]
    assert sorted(m["body"] for m in got) == sorted(s["body"] for s in sent)
    for m in got:
        assert m["tag"] == "TagA" and m["delivery_attempt"] == 1 and not m["corrupted"]
        assert m["properties"] == {"seq": m["body"].rsplit("-", 1)[1]}


async def test_official_client_and_tidemq_sdk_read_each_others_messages(
        cluster: Cluster) -> None:
    topic = cluster.topic()
    # official client → tidemq SDK (SimpleConsumer over REST, through the nameserver's routes)
    sent = cluster.client("send", "--topic", topic, "--count", 4, "--prefix", "grpc")["sent"]
    async with SimpleConsumer(unique("sdk"), topic=topic,
                              nameservers=[cluster.nameserver_url]) as consumer:
        received: list[ReceivedMessage] = []
        deadline = time.monotonic() + 20
        while len(received) < 4 and time.monotonic() < deadline:
            batch = await consumer.receive(max=16, wait_ms=1000)
            received.extend(batch)
            if batch:
                await consumer.ack(batch)
    assert sorted(m.message_id for m in received) == sorted(s["message_id"] for s in sent)
    assert sorted(m.text for m in received) == sorted(s["body"] for s in sent)

    # tidemq SDK → official client (with a binary body: the MD5 digest must match)
    body = bytes(range(256)) * 3
    async with Producer(nameservers=[cluster.nameserver_url]) as producer:
        results = [await producer.send(f"sdk-{i}", topic=topic, tag="FromSdk",
                                       keys=[f"k{i}"], properties={"i": str(i)})
                   for i in range(3)]
        binary = await producer.send(body, topic=topic, tag="FromSdk")
    got = cluster.client("receive", "--topic", topic, "--count", 4, "--tag", "FromSdk",
                         "--consumer-group", unique("g"))["received"]
    by_id = {m["message_id"]: m for m in got}
    assert set(by_id) == {r.message_id for r in [*results, binary]}
    for i, r in enumerate(results):
        m = by_id[r.message_id]
        assert (m["body"], m["tag"], m["keys"], m["properties"]) == (
            f"sdk-{i}", "FromSdk", [f"k{i}"], {"i": str(i)})
    assert not any(m["corrupted"] for m in got)  # the client checked every MD5 digest


def test_fifo_message_groups_are_consumed_in_order(cluster: Cluster) -> None:
    topic = cluster.topic(queues=4)
    sent = cluster.client("send", "--topic", topic, "--count", 30, "--group", "order",
                          "--groups", 3, "--prefix", "fifo")["sent"]
    got = cluster.client("receive", "--topic", topic, "--count", 30, "--batch", 4,
                         "--consumer-group", unique("g"))["received"]
    assert len(got) == 30
    order: dict[str, list[int]] = defaultdict(list)
    for m in got:
        assert m["message_type"] == 2  # FIFO
        order[m["message_group"]].append(int(m["body"].rsplit("-", 1)[1]))
    expected: dict[str, list[int]] = defaultdict(list)
    for s in sent:
        expected[s["group"]].append(int(s["body"].rsplit("-", 1)[1]))
    assert dict(order) == dict(expected)
    # one group lives in one queue: its message group is the sharding key (REST shows it)
    by_id = {m["message_id"]: m for m in pull_all(cluster, topic)}
    queues: dict[str, set[int]] = defaultdict(set)
    for s in sent:
        queues[s["group"]].add(by_id[s["message_id"]]["queue_id"])
    assert all(len(q) == 1 for q in queues.values()), queues


def test_push_consumer_gets_every_message(cluster: Cluster) -> None:
    topic = cluster.topic()
    sent = cluster.client("send", "--topic", topic, "--count", 10, "--prefix", "push")["sent"]
    got = cluster.client("push", "--topic", topic, "--count", 10, "--consumer-group",
                         unique("g"), "--timeout", 20)["received"]
    assert sorted(m["message_id"] for m in got) == sorted(s["message_id"] for s in sent)


def test_simple_consumer_invisibility_ack_and_redelivery(cluster: Cluster) -> None:
    topic = cluster.topic(queues=1)
    cluster.client("send", "--topic", topic, "--count", 3, "--prefix", "inv")
    result = cluster.client("invisibility", "--topic", topic, "--invisible", 2, "--extend", 6,
                            "--consumer-group", unique("g"), "--timeout", 30)
    first, again = result["events"]
    acked, extended, left = first["messages"]
    back = {m["body"]: m for m in again["messages"]}
    assert set(back) == {extended["body"], left["body"]}  # the acked one never comes back
    assert back[left["body"]]["delivery_attempt"] == 2
    assert back[extended["body"]]["delivery_attempt"] == 2
    # the un-acked one returned after its 2 s; the extended one not before its 6 s
    assert back[left["body"]]["received_ms"] - first["at_ms"] >= 1500
    assert back[extended["body"]]["received_ms"] - first["at_ms"] >= 5500
    assert acked["delivery_attempt"] == 1


def test_refusals_carry_rocketmq_status_codes(cluster: Cluster) -> None:
    """A topic that does not exist: the client fails with NOT_FOUND, nothing crashes."""
    proc = cluster.start_client("send", "--topic", unique("missing"), "--count", 1)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "TOPIC_NOT_FOUND" in err or "failed to fetch topic" in err, err[-2000:]
    assert httpx.get(f"{cluster.broker_url}/healthz").status_code == 200

