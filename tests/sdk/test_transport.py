"""The SDK's transport seam (sdk/tidemq/_transport.py): the ``MockTransport`` shipped for users'
tests carries a real client's requests, and its failures come out as the SDK's own errors."""

from __future__ import annotations

from typing import Any

import pytest
from tidemq import (
    MockTransport,
    Producer,
    TopicNotFoundError,
    TransportError,
    TransportRequest,
    TransportResponse,
)
from tidemq._exceptions import WireConnectError, WireError
from tidemq._http import NO_RETRY, HttpClient
from tidemq.protocol.records.v2 import CONTENT_BATCH

NS = "http://ns.test:9876"
BROKER = "http://broker.test:10911"


def _route(topic: str) -> dict[str, Any]:
    return {"topic": topic, "queues": [{"broker_name": "b1", "address": BROKER, "queues": 2,
                                        "perm": "rw"}]}


async def test_a_producer_sends_through_a_mock_transport() -> None:
    stored: list[dict[str, Any]] = []

    async def handle(request: TransportRequest) -> TransportResponse:  # a coroutine works too
        if request.url == f"{NS}/v1/routes/orders":
            return TransportResponse.encoded(200, _route("orders"))
        if request.url == f"{BROKER}/v1/topics/orders/messages":
            messages = request.payload()["messages"]
            stored.extend(messages)
            return TransportResponse.encoded(200, {"results": [
                {"message_id": m["message_id"], "queue_id": m["queue_id"], "queue_offset": i}
                for i, m in enumerate(messages)]})
        return TransportResponse.encoded(404, {"code": "TOPIC_NOT_FOUND", "message": "no"})

    transport = MockTransport(handle)
    async with Producer(nameservers=[NS], transport=transport, retry=NO_RETRY) as producer:
        result = await producer.send(b"order 42", topic="orders", tag="paid")
        with pytest.raises(TopicNotFoundError):
            await producer.send(b"x", topic="missing")
    assert [m["body"] for m in stored] == [b"order 42"] and stored[0]["tag"] == "paid"
    assert (result.topic, result.queue_offset) == ("orders", 0)
    assert result.message_id == stored[0]["message_id"] and result.queue_id in (0, 1)
    sent = next(r for r in transport.requests if r.method == "POST")
    assert sent.headers["content-type"] == CONTENT_BATCH  # read by payload() as its messages
    assert transport.closed  # the producer closes its transport


async def test_a_lost_connection_is_a_transport_error_saying_whether_it_was_sent() -> None:
    def refuse(request: TransportRequest) -> TransportResponse:
        raise WireConnectError("connection refused")

    def lose(request: TransportRequest) -> TransportResponse:
        raise WireError("reset after the request went out")

    for handler, sent in ((refuse, False), (lose, True)):
        client = HttpClient(transport=MockTransport(handler), retry=NO_RETRY)
        with pytest.raises(TransportError) as info:
            await client.call("GET", f"{BROKER}/v1/topics")
        assert info.value.sent is sent
        await client.aclose()
