"""A local transaction that raises is never mistaken for a sent message: ``TransactionProducer
.send`` ends the transaction (ROLLBACK or UNKNOWN) and then raises ``LocalTransactionError`` from
the original exception. Against an in-memory broker (httpx.MockTransport) that records the ends."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import httpx
import msgpack
import orjson
import pytest
from sqlalchemy import Column, Integer, MetaData, Table, func, select
from sqlalchemy.ext.asyncio import AsyncConnection
from tidemq import (
    LocalTransactionError,
    LocalTransactionFailed,
    Message,
    ReceivedMessage,
    TidemqError,
    TransactionProducer,
    TransactionState,
)
from tidemq.outbox import OutboxListener
from tidemq.protocol.records.v2 import CONTENT_BATCH
from tidemq.protocol.records.v2_read import as_messages

BROKER = "http://broker.test"


class RecordingBroker:
    """Answers half messages and ends; remembers every end action by transaction id."""

    def __init__(self) -> None:
        self.ends: dict[str, str] = {}
        self._ids = itertools.count()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body: Any = None
        kind = request.headers.get("content-type", "")
        if kind == CONTENT_BATCH:  # half messages as a batch
            body = {"messages": [{"message_id": m.message_id}
                                 for m in as_messages(request.content)]}
        elif request.content:
            body = (msgpack.unpackb(request.content) if "msgpack" in kind
                    else orjson.loads(request.content))
        answer: Any = {}
        if path.startswith("/v1/topics/"):
            answer = {"name": "orders", "queues": 1, "perm": "rw"}
        elif path in ("/v1/transactions", "/v1/transactions/end"):
            ends = body.get("ends") or []
            for end in ends:
                self.ends[end["transaction_id"]] = end["action"]
            answer = {"results": [{"transaction_id": e["transaction_id"], "state": "half"}
                                  for e in ends]}
            if path == "/v1/transactions":
                answer["transactions"] = [{"transaction_id": f"tx{next(self._ids)}",
                                           "message_id": m["message_id"]}
                                          for m in body["messages"]]
        elif path.endswith("/checks"):
            answer = {"checks": []}
        if "msgpack" in request.headers.get("accept", ""):
            return httpx.Response(200, content=msgpack.packb(answer, use_bin_type=True),
                                  headers={"content-type": "application/msgpack"})
        return httpx.Response(200, json=answer)


class Scripted:
    def __init__(self, outcome: BaseException | TransactionState) -> None:
        self.outcome = outcome

    async def execute_local_transaction(self, message: Message, arg: Any) -> TransactionState:
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome

    async def check_local_transaction(self, message: ReceivedMessage) -> TransactionState:
        return TransactionState.UNKNOWN


def producer(broker: RecordingBroker, listener: Any) -> TransactionProducer:
    return TransactionProducer("orders-tx", listener, broker_url=BROKER,
                               transport=httpx.MockTransport(broker), check_wait_ms=50)


def rolled_back() -> LocalTransactionFailed:
    try:
        raise KeyError("no such order")
    except KeyError as exc:
        try:
            raise LocalTransactionFailed("rolled back") from exc
        except LocalTransactionFailed as failed:
            return failed


async def test_a_rolled_back_local_transaction_raises_after_the_rollback() -> None:
    broker = RecordingBroker()
    async with producer(broker, Scripted(rolled_back())) as p:
        with pytest.raises(LocalTransactionError) as caught:
            await p.send("order 7", topic="orders")
    err = caught.value
    assert isinstance(err, TidemqError) and not err.retriable
    assert isinstance(err.__cause__, KeyError)  # the business failure, not the wrapper
    assert err.result.local_state is TransactionState.ROLLBACK
    assert err.result.error is err.__cause__ and err.result.end_error is None
    assert broker.ends == {err.result.transaction_id: "rollback"}  # ended before raising
    assert "never be delivered" in str(err)


async def test_any_other_exception_ends_unknown_and_raises() -> None:
    broker = RecordingBroker()
    async with producer(broker, Scripted(RuntimeError("database gone"))) as p:
        with pytest.raises(LocalTransactionError) as caught:
            await p.send("order 8", topic="orders")
    err = caught.value
    assert isinstance(err.__cause__, RuntimeError)
    assert err.result.local_state is TransactionState.UNKNOWN
    assert broker.ends == {err.result.transaction_id: "unknown"}
    assert "will check it" in str(err)


async def test_a_successful_send_returns_a_result_without_error() -> None:
    broker = RecordingBroker()
    async with producer(broker, Scripted(TransactionState.COMMIT)) as p:
        result = await p.send("order 9", topic="orders")
    assert result.local_state is TransactionState.COMMIT and result.error is None
    assert broker.ends == {result.transaction_id: "commit"}


async def test_outbox_business_failure_surfaces_from_send(tmp_path: Path) -> None:
    meta = MetaData()
    orders = Table("orders", meta, Column("id", Integer, primary_key=True))
    outbox = OutboxListener(f"sqlite+aiosqlite:///{tmp_path / 'shop.db'}")
    await outbox.create_table()
    async with outbox.engine.begin() as conn:
        await conn.run_sync(meta.create_all)

    async def out_of_stock(conn: AsyncConnection, message: Message) -> None:
        await conn.execute(orders.insert().values(id=1))
        raise ValueError("out of stock")

    broker = RecordingBroker()
    try:
        async with producer(broker, outbox) as p:
            with pytest.raises(LocalTransactionError) as caught:
                await p.send("order 1", topic="orders", arg=out_of_stock)
        async with outbox.engine.connect() as conn:
            count = (await conn.execute(select(func.count()).select_from(orders))).scalar()
    finally:
        await outbox.close()
    assert isinstance(caught.value.__cause__, ValueError)
    assert caught.value.result.local_state is TransactionState.ROLLBACK
    assert broker.ends == {caught.value.result.transaction_id: "rollback"}
    assert count == 0  # the business change rolled back with the message
