"""Typed handlers on a real system (the ``tidemq_system`` fixture): a producer sends a model, a
``Router`` hands it decoded to the handler of its tag; a body that is not the model is retried
and then dead-lettered, and the DLQ copy says why in ``TIDE_CONSUME_FAILURE``."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel
from tidemq import ReceivedMessage, Router
from tidemq.protocol import CONSUME_FAILURE, dlq_topic
from tidemq.testing import MAX_RECONSUME_TIMES, TidemqSystem

pytestmark = pytest.mark.integration


class OrderPaid(BaseModel):
    order_id: int
    amount: float


async def test_a_model_reaches_its_handler_and_a_bad_body_the_dlq_with_its_reason(
        tidemq_system: TidemqSystem) -> None:
    topic, group = await tidemq_system.create_topic(), "typed-billing"
    paid: asyncio.Queue[OrderPaid] = asyncio.Queue()
    refunded: list[dict[str, object]] = []
    deliveries: list[int] = []
    router = Router()

    @router.handler(topic, tag="Paid")
    async def on_paid(order: OrderPaid, message: ReceivedMessage) -> None:
        deliveries.append(message.reconsume_times)
        await paid.put(order)

    @router.handler(topic, tag="Refunded")
    async def on_refund(body: dict[str, object]) -> None:
        refunded.append(body)

    async with tidemq_system.producer() as producer:
        await producer.send(OrderPaid(order_id=42, amount=9.9), topic=topic, tag="Paid")
        await producer.send(b'{"order_id": 43}', topic=topic, tag="Refunded")
        bad = await producer.send(b'{"order_id": "forty-four"}', topic=topic, tag="Paid")
    async with tidemq_system.consumer(group, router, router.subscriptions):
        assert await asyncio.wait_for(paid.get(), timeout=20) == OrderPaid(order_id=42,
                                                                           amount=9.9)
        dead = await tidemq_system.wait_for_message(dlq_topic(group),
                                                    message_id=bad.message_id, timeout_s=60)
    assert refunded == [{"order_id": 43}]
    assert deliveries == [0]  # the bad body never reached the handler
    assert dead.reconsume_times == MAX_RECONSUME_TIMES + 1
    reason = dead.properties[CONSUME_FAILURE]
    assert reason.startswith(f"BodyDecodeError: message {bad.message_id} of {topic!r}: the "
                             "body is not a valid OrderPaid: 2 error(s): order_id:"), reason
    assert "amount: Field required" in reason
    assert paid.empty()
