"""The gRPC front door reports no queue offset for a delayed message (raw stubs, a real broker).

SendMessage answers through the REST send path; a DELAY message has no position in its queue
until it is delivered, so its entry's offset is -1 (not the timer topic's offset, which in the
user's topic belongs to another message). A delivery time past the maximum delay is refused.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest

from tests.support.broker import BrokerHandle, run_broker, unique
from tests.support.clock import now_ms
from tests.support.procs import RedisServer, free_port, wait_port
from tidemq_server.broker.grpc.proto import Code, MessageType, pb, service_grpc, service_pb

pytestmark = pytest.mark.integration

HEADERS = (("x-mq-client-id", "delay-positions-test"),)
HOUR_MS = 3_600_000


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory,
           redis_server: RedisServer) -> Iterator[tuple[BrokerHandle, int]]:
    port = free_port()
    with run_broker(tmp_path_factory.mktemp("grpc-delays"), redis_server.url,
                    grpc_port=port) as handle:
        wait_port(port)
        yield handle, port


@pytest.fixture
async def stub(broker: tuple[BrokerHandle, int]) -> AsyncIterator[Any]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker[1]}") as channel:
        yield service_grpc.MessagingServiceStub(channel)


def delayed(topic: str, mid: str, deliver_at_ms: int) -> Any:
    msg = pb.Message(body=b"later")
    msg.topic.name = topic
    sp = msg.system_properties
    sp.message_id = mid
    sp.message_type = MessageType.Value("DELAY")
    sp.delivery_timestamp.seconds, rest = divmod(deliver_at_ms, 1000)
    sp.delivery_timestamp.nanos = rest * 1_000_000
    return msg


async def test_a_delayed_grpc_send_has_no_offset(stub: Any, broker: tuple[BrokerHandle, int]
                                                 ) -> None:
    b = broker[0]
    topic = b.create_topic(queues=2)
    b.send(topic, {"body": "plain", "queue_id": 0}, {"body": "plain", "queue_id": 1})
    mid = unique("grpc-delay")
    due = now_ms() + HOUR_MS
    res = await stub.SendMessage(service_pb.SendMessageRequest(messages=[delayed(topic, mid, due)]),
                                 metadata=HEADERS, timeout=10)
    assert res.status.code == Code.OK, res.status
    (entry,) = res.entries
    assert entry.message_id == mid and entry.offset == -1 and entry.recall_handle == mid
    shown = b.http.get(f"/v1/messages/{mid}").json()
    assert shown["state"] == "scheduled" and shown["queue_offset"] is None
    assert shown["deliver_at_ms"] == due


async def test_a_delivery_time_past_the_maximum_is_refused(stub: Any,
                                                            broker: tuple[BrokerHandle, int]
                                                            ) -> None:
    topic = broker[0].create_topic(queues=1)
    far = now_ms() + 31 * 24 * HOUR_MS
    res = await stub.SendMessage(
        service_pb.SendMessageRequest(messages=[delayed(topic, unique("far"), far)]),
        metadata=HEADERS, timeout=10)
    assert res.status.code == Code.ILLEGAL_DELIVERY_TIME, res.status
    assert "maximum delay" in res.status.message
