"""The official RocketMQ 5 Python client against two broker groups behind one nameserver.

The client knows one access point (broker-a's gRPC door). Its route lists the queues of both
groups, each with its own group's endpoint, so normal, FIFO, transactional and delayed
messages land on both groups and are received from both; transaction checks of both groups'
checkers reach the client over its Telemetry stream to each door.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.broker.grpc.conftest import Cluster
from tests.support.broker import unique
from tests.support.groups import GroupProcs, Groups, run_groups
from tests.support.procs import RedisServer, wait_port
from tests.support.wait import wait_until
from tidemq_server.broker.grpc.proto import Code, FilterType, service_grpc, service_pb

pytestmark = pytest.mark.integration

HEADERS = (("x-mq-client-id", "groups-test-client"),)
#: checks only after 3 s: a producer that leaves its transactions open is gone by then
CHECKER = {"TRANSACTION_TIMEOUT_MS": "3000", "CHECK_INTERVAL_MS": "500"}


@pytest.fixture(scope="module")
def two_groups(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer,
               rmq_python: Path) -> Iterator[tuple[Groups, Cluster]]:
    work = tmp_path_factory.mktemp("grpc-groups")
    home = work / "home"
    home.mkdir()
    with run_groups(work, redis_server.url, groups=2, grpc=True, checker=CHECKER) as running:
        for group in running.groups.values():
            wait_port(group.grpc_port)
        a = running.groups["broker-a"]
        yield running, Cluster(broker_url=a.url, nameserver_url=running.nameservers[0].url,
                               grpc_endpoint=f"127.0.0.1:{a.grpc_port}", python=rmq_python,
                               home=home)


def route(endpoint: str, topic: str) -> list[Any]:
    with grpc.insecure_channel(endpoint) as channel:
        req = service_pb.QueryRouteRequest()
        req.topic.name = topic
        res = service_grpc.MessagingServiceStub(channel).QueryRoute(req, metadata=HEADERS,
                                                                    timeout=10)
    assert res.status.code == Code.OK, res.status
    return list(res.message_queues)


def topic_on_both(running: Groups, client: Cluster, queues: int = 2) -> str:
    """A topic created on both groups, once broker-a's door routes to both."""
    topic = unique("G")
    for group in running.groups.values():
        group.create_topic(topic, queues)
    wait_until(lambda: {q.broker.name for q in route(client.grpc_endpoint, topic)}
               == set(running.groups), 15, "a route over both groups")
    return topic


def holder(running: Groups, message_id: str) -> tuple[GroupProcs, str]:
    """The group holding ``message_id`` and the message's state there."""
    found = []
    for group in running.groups.values():
        resp = group.http.get(f"{group.url}/v1/messages/{message_id}")
        if resp.status_code == 200:
            found.append((group, str(resp.json()["state"])))
        else:
            assert resp.status_code == 404, resp.text
    assert len(found) == 1, (message_id, found)
    return found[0]


def test_route_and_assignment_list_every_groups_door(two_groups: tuple[Groups, Cluster]
                                                     ) -> None:
    running, client = two_groups
    topic = topic_on_both(running, client, queues=3)
    by_group = defaultdict(list)
    for q in route(client.grpc_endpoint, topic):
        by_group[q.broker.name].append(q)
    for name, group in running.groups.items():
        queues = by_group[name]
        assert sorted(q.id for q in queues) == [0, 1, 2]
        assert {(a.host, a.port) for q in queues for a in q.broker.endpoints.addresses} == \
            {("127.0.0.1", group.grpc_port)}
    b = running.groups["broker-b"]
    assert {q.broker.name for q in route(f"127.0.0.1:{b.grpc_port}", topic)} == set(by_group)
    with grpc.insecure_channel(client.grpc_endpoint) as channel:
        stub = service_grpc.MessagingServiceStub(channel)
        req = service_pb.QueryAssignmentRequest()
        req.topic.name, req.group.name = topic, unique("g")
        res = stub.QueryAssignment(req, metadata=HEADERS, timeout=10)
        assert res.status.code == Code.OK, res.status
        assert sorted(x.message_queue.broker.name for x in res.assignments) == sorted(by_group)
        # broker-a's door serves broker-a's queues only
        recv = service_pb.ReceiveMessageRequest(batch_size=1)
        recv.group.name = unique("g")
        recv.message_queue.CopyFrom(by_group["broker-b"][0])
        recv.filter_expression.type = FilterType.TAG
        recv.filter_expression.expression = "*"
        recv.long_polling_timeout.seconds = 1
        [answer] = list(stub.ReceiveMessage(recv, metadata=HEADERS, timeout=10))
        assert answer.status.code == Code.ILLEGAL_ACCESS_POINT, answer.status
        assert "broker-b" in answer.status.message
    missing = service_pb.QueryRouteRequest()
    missing.topic.name = unique("Nowhere")
    with grpc.insecure_channel(client.grpc_endpoint) as channel:
        res = service_grpc.MessagingServiceStub(channel).QueryRoute(missing, metadata=HEADERS,
                                                                    timeout=10)
    assert res.status.code == Code.TOPIC_NOT_FOUND, res.status


def test_normal_messages_land_on_both_groups_and_come_back_from_both(
        two_groups: tuple[Groups, Cluster]) -> None:
    running, client = two_groups
    topic = topic_on_both(running, client)
    sent = client.client("send", "--topic", topic, "--count", 20, "--prefix", "n")["sent"]
    on: dict[str, int] = defaultdict(int)
    for s in sent:
        group, state = holder(running, s["message_id"])
        assert state == "stored", state
        on[group.name] += 1
    assert set(on) == set(running.groups) and min(on.values()) >= 5, on
    got = client.client("receive", "--topic", topic, "--count", 20,
                        "--consumer-group", unique("simple"))["received"]
    assert sorted(m["message_id"] for m in got) == sorted(s["message_id"] for s in sent)
    pushed = client.client("push", "--topic", topic, "--count", 20,
                           "--consumer-group", unique("push"))["received"]
    assert sorted({m["message_id"] for m in pushed}) == sorted(s["message_id"] for s in sent)


def test_fifo_groups_stay_in_order_on_one_queue_of_one_group(
        two_groups: tuple[Groups, Cluster]) -> None:
    running, client = two_groups
    topic = topic_on_both(running, client)
    sent = client.client("send", "--topic", topic, "--count", 32, "--group", "order",
                         "--groups", 8, "--prefix", "f")["sent"]
    key_of = {s["body"]: s["group"] for s in sent}
    places: dict[str, set[tuple[str, int]]] = defaultdict(set)
    stored: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for group in running.groups.values():
        for m in group.messages(topic):
            key = key_of[m["body"]]
            places[key].add((group.name, m["queue_id"]))
            stored[key].append((m["queue_offset"], m["body"]))
    assert len(places) == 8 and all(len(p) == 1 for p in places.values()), places
    assert {name for p in places.values() for name, _ in p} == set(running.groups)
    for key, items in stored.items():
        bodies = [body for _, body in sorted(items)]
        assert bodies == [s["body"] for s in sent if s["group"] == key]
    got = client.client("receive", "--topic", topic, "--count", 32,
                        "--consumer-group", unique("fifo"))["received"]
    assert len({m["message_id"] for m in got}) == 32


def test_transactions_commit_and_checks_reach_the_client_from_both_groups(
        two_groups: tuple[Groups, Cluster]) -> None:
    running, client = two_groups
    topic = topic_on_both(running, client)
    committed = client.client("transaction", "--topic", topic, "--count", 6, "--end", "commit",
                              "--prefix", "c")["sent"]
    orphans = client.client("transaction", "--topic", topic, "--count", 4, "--end", "none",
                            "--prefix", "o")["sent"]
    groups_of = {holder(running, s["message_id"])[0].name for s in committed + orphans}
    assert groups_of == set(running.groups)
    assert {holder(running, s["message_id"])[1] for s in committed} == {"committed"}
    assert {holder(running, s["message_id"])[1] for s in orphans} == {"half"}
    assert {holder(running, s["message_id"])[0].name for s in orphans} == set(running.groups)
    checked = client.client("checker", "--topic", topic, "--answer", "commit", "--count", 4,
                            "--timeout", 40, timeout=60)["checked"]
    assert sorted(c["message_id"] for c in checked) == sorted(s["message_id"] for s in orphans)
    wait_until(lambda: {holder(running, s["message_id"])[1] for s in orphans} == {"committed"},
               15, "every orphan committed through its check")
    got = client.client("receive", "--topic", topic, "--count", 10,
                        "--consumer-group", unique("tx"))["received"]
    assert sorted(m["message_id"] for m in got) == \
        sorted(s["message_id"] for s in committed + orphans)


def test_delayed_messages_on_both_groups_are_never_received_early(
        two_groups: tuple[Groups, Cluster]) -> None:
    running, client = two_groups
    topic = topic_on_both(running, client)
    group = unique("late")
    sent = client.client("send", "--topic", topic, "--count", 6, "--delay-ms", 4000,
                         "--prefix", "d")["sent"]
    assert {holder(running, s["message_id"])[0].name for s in sent} == set(running.groups)
    early = client.client("receive", "--topic", topic, "--count", 1, "--timeout", "1.5",
                          "--consumer-group", group)["received"]
    due = {s["message_id"]: s["due_ms"] for s in sent}
    assert all(m["received_ms"] >= due[m["message_id"]] for m in early)
    got = early + client.client("receive", "--topic", topic, "--count", 6 - len(early),
                                "--timeout", 30, "--consumer-group", group)["received"]
    assert sorted(m["message_id"] for m in got) == sorted(due)
    assert all(m["received_ms"] >= due[m["message_id"]] for m in got)


def test_a_recall_at_the_access_point_reaches_the_group_holding_the_message(
        two_groups: tuple[Groups, Cluster]) -> None:
    running, client = two_groups
    topic = topic_on_both(running, client)
    sent = client.client("send", "--topic", topic, "--count", 4, "--delay-ms", 60_000,
                         "--recall", "--prefix", "r")["sent"]
    assert [s["recalled"] for s in sent] == [s["message_id"] for s in sent]
    places = [holder(running, s["message_id"]) for s in sent]
    assert {g.name for g, _ in places} == set(running.groups)
    assert {state for _, state in places} == {"cancelled"}
