"""Every property name starting with ``TIDE_`` belongs to the broker: no write door takes one from
a client (a real broker with its gRPC door). A producer could otherwise forge
``TIDE_CONSUME_FAILURE``, the failure reason the broker puts on retry and DLQ copies.

Each door answers 400 (gRPC: ``BAD_REQUEST``) naming the property, and stores nothing: a JSON
send, a msgpack send, a record batch (the SDK's form), a JSON half, a half batch, and gRPC's
SendMessage (RocketMQ 5 user properties). A name that merely contains ``TIDE_`` is the user's.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import httpx
import pytest
from tidemq._batch import encode_halves, encode_messages
from tidemq.protocol import OutgoingMessage
from tidemq.protocol.records.v2 import CONTENT_BATCH

from tests.support.broker import BrokerHandle, msgpack_post, run_broker, unique
from tests.support.clock import now_ms
from tests.support.procs import RedisServer, free_port, wait_port
from tests.support.transactions import pending
from tidemq_server.broker.grpc.proto import Code, pb, service_grpc, service_pb

pytestmark = pytest.mark.integration

FORGED = {"TIDE_CONSUME_FAILURE": "forged reason"}
HEADERS = (("x-mq-client-id", "reserved-prefix-test"),)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory,
           redis_server: RedisServer) -> Iterator[tuple[BrokerHandle, int]]:
    port = free_port()
    with run_broker(tmp_path_factory.mktemp("reserved-prefix"), redis_server.url,
                    grpc_port=port) as handle:
        wait_port(port)
        yield handle, port


def _named(b: BrokerHandle, resp: httpx.Response, name: str = "TIDE_CONSUME_FAILURE") -> None:
    message = b.error(resp, 400, "BAD_REQUEST")
    assert repr(name) in message and "reserved" in message, message


def _outgoing(properties: dict[str, str]) -> OutgoingMessage:
    return OutgoingMessage(body=b"x", message_id=uuid.uuid4().hex, queue_id=0,
                           properties=properties)


def test_every_rest_send_door_refuses_a_tide_property(broker: tuple[BrokerHandle, int]
                                                      ) -> None:
    b = broker[0]
    topic = b.create_topic(queues=1)
    path = f"/v1/topics/{topic}/messages"
    body = {"messages": [{"body": "ok"}, {"body": "forged", "properties": FORGED}]}
    _named(b, b.http.post(path, json=body))
    _named(b, msgpack_post(b.http, path, body))
    _named(b, b.http.post(path, json={"messages": [
        {"body": "x", "properties": {"TIDE_ANYTHING_NEW": "1"}}]}), "TIDE_ANYTHING_NEW")
    raw = encode_messages(topic, 0, [_outgoing({}), _outgoing(FORGED)], now_ms())
    _named(b, b.http.post(path, content=raw, headers={"content-type": CONTENT_BATCH}))
    assert b.pull(topic, 0)["messages"] == []
    kept = b.send(topic, {"body": "mine", "properties": {"MY_TIDE_NOTE": "1", "tide_x": "2"}})
    assert kept[0]["message_id"]
    [got] = b.pull(topic, 0)["messages"]
    assert got["properties"] == {"MY_TIDE_NOTE": "1", "tide_x": "2"}


def test_transaction_halves_refuse_a_tide_property(broker: tuple[BrokerHandle, int]) -> None:
    b = broker[0]
    topic, group = b.create_topic(queues=1), unique("G")
    _named(b, b.http.post("/v1/transactions", json={
        "producer_group": group, "topic": topic,
        "message": {"body": "x", "properties": FORGED}}))
    halves = encode_halves(group, topic, None, [_outgoing(FORGED)], [uuid.uuid4().hex], 1_000)
    _named(b, b.http.post("/v1/transactions", params={"producer_group": group, "topic": topic},
                          content=halves, headers={"content-type": CONTENT_BATCH}))
    assert pending(b, group) == []


@pytest.fixture
async def stub(broker: tuple[BrokerHandle, int]) -> AsyncIterator[Any]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker[1]}") as channel:
        yield service_grpc.MessagingServiceStub(channel)


async def test_grpc_send_refuses_a_tide_user_property(stub: Any,
                                                      broker: tuple[BrokerHandle, int]) -> None:
    b = broker[0]
    topic = b.create_topic(queues=1)
    msg = pb.Message(body=b"forged")
    msg.topic.name = topic
    msg.system_properties.message_id = unique("grpc")
    msg.user_properties.update(FORGED)
    res = await stub.SendMessage(service_pb.SendMessageRequest(messages=[msg]),
                                 metadata=HEADERS, timeout=10)
    assert res.status.code == Code.BAD_REQUEST, res.status
    assert "TIDE_CONSUME_FAILURE" in res.status.message
    assert b.pull(topic, 0)["messages"] == []
