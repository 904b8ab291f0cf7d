"""The RPCs the official client rarely or never makes on its own, called through raw stubs.

ForwardMessageToDeadLetterQueue, the server-side dead-lettering after the delivery limit,
refusals as RocketMQ status codes (stale receipt handles, SQL filters, unknown topics, a
missing client id), and the settings a Telemetry stream answers with.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from tests.broker.grpc.conftest import MAX_RECONSUME_TIMES, Cluster
from tests.support.broker import unique
from tidemq_server.broker.grpc.proto import (
    ClientType,
    Code,
    FilterType,
    pb,
    service_grpc,
    service_pb,
)

pytestmark = pytest.mark.integration

HEADERS = (("x-mq-client-id", "raw-test-client"),)


@pytest.fixture
async def stub(cluster: Cluster) -> AsyncIterator[Any]:
    async with grpc.aio.insecure_channel(cluster.grpc_endpoint) as channel:
        yield service_grpc.MessagingServiceStub(channel)


async def receive(stub: Any, topic: str, group: str, invisible_s: int = 30,
                  expression: str = "*", sql: bool = False) -> tuple[Any, list[Any]]:
    req = service_pb.ReceiveMessageRequest(batch_size=16)
    req.group.name = group
    req.message_queue.topic.name = topic
    req.message_queue.id = -1
    req.filter_expression.type = FilterType.SQL if sql else FilterType.TAG
    req.filter_expression.expression = expression
    req.invisible_duration.seconds = invisible_s
    req.long_polling_timeout.seconds = 1
    status: Any = None
    messages: list[Any] = []
    async for res in stub.ReceiveMessage(req, metadata=HEADERS, timeout=10):
        kind = res.WhichOneof("content")
        if kind == "status":
            assert status is None and not messages, "the status comes first"
            status = res.status
        elif kind == "message":
            messages.append(res.message)
    return status, messages


def send(cluster: Cluster, topic: str, *bodies: str) -> list[str]:
    resp = cluster.http.post(f"{cluster.broker_url}/v1/topics/{topic}/messages",
                             json={"messages": [{"body": b} for b in bodies]})
    assert resp.status_code == 200, resp.text
    return [r["message_id"] for r in resp.json()["results"]]


def dlq(cluster: Cluster, group: str) -> list[str]:
    resp = cluster.http.get(f"{cluster.broker_url}/v1/topics/%25DLQ%25{group}/queues/0/messages",
                            params={"offset": 0})
    if resp.status_code == 404:
        return []
    assert resp.status_code == 200, resp.text
    return [m["message_id"] for m in resp.json()["messages"]]


async def test_forward_to_dlq_moves_the_message_and_acks_it(cluster: Cluster, stub: Any) -> None:
    topic, group = cluster.topic(queues=1), unique("g")
    [mid] = send(cluster, topic, "poison")
    status, [msg] = await receive(stub, topic, group, invisible_s=1)
    assert status.code == Code.OK
    req = service_pb.ForwardMessageToDeadLetterQueueRequest(
        receipt_handle=msg.system_properties.receipt_handle, message_id=mid,
        delivery_attempt=1, max_delivery_attempts=1)
    req.group.name, req.topic.name = group, topic
    res = await stub.ForwardMessageToDeadLetterQueue(req, metadata=HEADERS)
    assert res.status.code == Code.OK, res.status
    assert dlq(cluster, group) == [mid]
    status, again = await receive(stub, topic, group)  # acked: never comes back
    assert status.code == Code.MESSAGE_NOT_FOUND and again == []


async def test_a_message_past_the_delivery_limit_goes_to_the_dlq(cluster: Cluster,
                                                                 stub: Any) -> None:
    topic, group = cluster.topic(queues=1), unique("g")
    [mid] = send(cluster, topic, "never acked")
    attempts: list[int] = []
    for _ in range(MAX_RECONSUME_TIMES + 2):
        _, got = await receive(stub, topic, group, invisible_s=0)
        attempts.extend(m.system_properties.delivery_attempt for m in got)
    assert attempts == list(range(1, MAX_RECONSUME_TIMES + 2))
    assert dlq(cluster, group) == [mid]


async def test_stale_handles_sql_filters_and_unknown_topics_are_refused(
        cluster: Cluster, stub: Any) -> None:
    topic, group = cluster.topic(queues=1), unique("g")
    send(cluster, topic, "one")
    _, [msg] = await receive(stub, topic, group)
    handle = msg.system_properties.receipt_handle
    change = service_pb.ChangeInvisibleDurationRequest(receipt_handle=handle)
    change.group.name, change.topic.name = group, topic
    change.invisible_duration.seconds = 30
    changed = await stub.ChangeInvisibleDuration(change, metadata=HEADERS)
    assert changed.status.code == Code.OK and changed.receipt_handle != handle

    ack = service_pb.AckMessageRequest()
    ack.group.name, ack.topic.name = group, topic
    ack.entries.add(message_id=msg.system_properties.message_id, receipt_handle=handle)
    res = await stub.AckMessage(ack, metadata=HEADERS)  # the old handle was superseded
    assert res.status.code == Code.INVALID_RECEIPT_HANDLE
    ack.entries[0].receipt_handle = changed.receipt_handle
    assert (await stub.AckMessage(ack, metadata=HEADERS)).status.code == Code.OK

    status, _ = await receive(stub, topic, group, expression="a > 1", sql=True)
    assert status.code == Code.ILLEGAL_FILTER_EXPRESSION
    route = service_pb.QueryRouteRequest()
    route.topic.name = unique("nope")
    assert (await stub.QueryRoute(route)).status.code == Code.TOPIC_NOT_FOUND
    assert (await stub.Heartbeat(service_pb.HeartbeatRequest())).status.code == \
        Code.CLIENT_ID_REQUIRED


async def test_routes_and_telemetry_settings(cluster: Cluster, stub: Any) -> None:
    topic = cluster.topic(queues=3)
    route = service_pb.QueryRouteRequest()
    route.topic.name = topic
    res = await stub.QueryRoute(route)
    assert [q.id for q in res.message_queues] == [0, 1, 2]
    queue = res.message_queues[0]
    host, port = cluster.grpc_endpoint.split(":")
    assert [(a.host, a.port) for a in queue.broker.endpoints.addresses] == [(host, int(port))]
    assert queue.permission == pb.Permission.READ_WRITE and queue.broker.id == 0
    assert set(queue.accept_message_types) >= {1, 2}  # NORMAL, FIFO (+ DELAY, TRANSACTION)

    settings = pb.Settings(client_type=ClientType.PRODUCER)
    settings.publishing.topics.add(name=topic)
    call = stub.Telemetry(metadata=HEADERS)
    await call.write(service_pb.TelemetryCommand(settings=settings))
    answer = await call.read()
    call.cancel()
    assert answer.status.code == Code.OK
    assert answer.settings.publishing.max_body_size == 4 * 1024 * 1024
    assert answer.settings.backoff_policy.max_attempts == 3

    metrics = cluster.http.get(f"{cluster.broker_url}/metrics").text
    assert 'tidemq_broker_grpc_requests_total{rpc="QueryRoute"}' in metrics
    assert "tidemq_broker_grpc_sessions" in metrics
