"""An application's test against a real tidemq, through the ``tidemq_system`` fixture.

The fixture comes with the SDK (the ``tidemq.testing`` pytest plugin): nothing to import. This
file is what a user's test looks like; CI runs it (``make test`` collects ``examples/``).
"""

from __future__ import annotations

import asyncio

import pytest
from tidemq import ConsumeResult, Message, ReceivedMessage, TransactionState
from tidemq.testing import TidemqSystem

pytestmark = pytest.mark.integration


class Orders:
    """The application's transactional listener: its local transaction is UNKNOWN at first
    (e.g. a commit whose outcome was lost), and the check-back finds the order committed."""

    def __init__(self) -> None:
        self.committed: set[str] = set()

    async def execute_local_transaction(self, message: Message, arg: object) -> TransactionState:
        assert message.message_id is not None
        self.committed.add(message.message_id)
        return TransactionState.UNKNOWN

    async def check_local_transaction(self, message: ReceivedMessage) -> TransactionState:
        known = message.message_id in self.committed
        return TransactionState.COMMIT if known else TransactionState.ROLLBACK


async def test_a_paid_order_reaches_billing(tidemq_system: TidemqSystem) -> None:
    topic = await tidemq_system.create_topic()
    seen: asyncio.Queue[ReceivedMessage] = asyncio.Queue()

    async def billing(message: ReceivedMessage) -> ConsumeResult:
        await seen.put(message)
        return ConsumeResult.SUCCESS

    async with tidemq_system.consumer("billing", billing, {topic: "Paid"}), \
            tidemq_system.producer() as producer:
        await producer.send(b"order 7 created", topic=topic, tag="Created")
        paid = await producer.send(b"order 7 paid", topic=topic, tag="Paid")
        got = await asyncio.wait_for(seen.get(), timeout=15)
    assert (got.message_id, got.body, got.tag) == (paid.message_id, b"order 7 paid", "Paid")


async def test_an_unknown_transaction_is_committed_by_its_check(
        tidemq_system: TidemqSystem) -> None:
    topic = await tidemq_system.create_topic()
    async with tidemq_system.transaction_producer("shop", Orders()) as producer:
        sent = await producer.send(Message(b"order 8", topic=topic), check_immunity_s=0)
        assert sent.local_state is TransactionState.UNKNOWN
        await tidemq_system.check_now()  # no waiting for the checker's next scan
        got = await tidemq_system.wait_for_message(topic, message_id=sent.message_id)
    assert got.body == b"order 8"


async def test_a_reminder_two_days_away_is_delivered_when_the_clock_moves(
        tidemq_system: TidemqSystem) -> None:
    topic = await tidemq_system.create_topic()
    async with tidemq_system.producer() as producer:
        sent = await producer.send(b"remind order 9", topic=topic, delay_ms=2 * 86_400_000)
    assert sent.scheduled
    await tidemq_system.advance_clock(2 * 86_400)  # for the rest of the session
    got = await tidemq_system.wait_for_message(topic, message_id=sent.message_id)
    assert got.body == b"remind order 9"
