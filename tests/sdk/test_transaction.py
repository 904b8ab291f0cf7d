"""``TransactionProducer`` against an in-memory broker (httpx.MockTransport): concurrent sends
and ends coalesced into the batch endpoints, an exception in execute ends as UNKNOWN, checks are
answered in a batch with ``from_check: true``; and the outbox listener on SQLite."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import httpx
import msgpack
import orjson
import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, select
from sqlalchemy.ext.asyncio import AsyncConnection
from tidemq import (
    BadRequestError,
    LocalTransactionError,
    LocalTransactionFailed,
    Message,
    ReceivedMessage,
    TransactionProducer,
    TransactionState,
)
from tidemq.outbox import OutboxListener
from tidemq.protocol import TRANSACTION_ID
from tidemq.protocol.records.v2 import CONTENT_BATCH
from tidemq.protocol.records.v2_read import as_messages

from tests.support.clock import now_ms

BROKER = "http://broker.test"


class FakeTxBroker:
    def __init__(self) -> None:
        self.halves: list[dict[str, Any]] = []  # one per request
        self.kinds: list[str] = []  # ... and its content type
        self.ends: list[dict[str, Any]] = []
        self.heartbeats = 0
        self.checks: list[dict[str, Any]] = []  # handed out once, then empty polls
        self.left = False
        self._ids = itertools.count()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        path, method = request.url.path, request.method
        if request.headers.get("content-type") == "application/msgpack":
            body = msgpack.unpackb(request.content)
        elif request.headers.get("content-type") == CONTENT_BATCH:  # half messages as a batch
            body = dict(request.url.params)
            body["messages"] = [{"message_id": m.message_id, "properties": m.properties}
                                for m in as_messages(request.content)]
        else:
            body = orjson.loads(request.content) if request.content else None
        if path.startswith("/v1/topics/"):
            return self._answer(request, {"name": "orders", "queues": 4, "perm": "rw"})
        if path == "/v1/transactions":
            self.halves.append(body)
            self.kinds.append(request.headers.get("content-type", ""))
            answer: dict[str, Any] = {"transactions": [  # a batch's ids are the producer's
                {"transaction_id": m.get("properties", {}).get(TRANSACTION_ID)
                 or f"tx{next(self._ids)}", "message_id": m["message_id"]}
                for m in body["messages"]]}
            if body.get("ends"):  # ends riding with half messages
                self.ends.append({"ends": body["ends"], "with_halves": True})
                answer["results"] = self._end_results(body["ends"])
            return self._answer(request, answer)
        if path == "/v1/transactions/end":
            self.ends.append({**body, "after_halves": len(self.halves)})
            return self._answer(request, {"results": self._end_results(body["ends"])})
        if path.endswith("/heartbeat"):
            self.heartbeats += 1
            return self._answer(request, {})
        if path.endswith("/checks"):
            checks, self.checks = self.checks, []
            if not checks:
                await asyncio.sleep(0.05)
            return self._answer(request, {"checks": checks})
        if method == "DELETE":
            self.left = True
            return self._answer(request, {})
        return httpx.Response(404, json={"code": "NOT_FOUND", "message": path})

    @staticmethod
    def _end_results(ends: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"transaction_id": e["transaction_id"],
                 "state": {"commit": "committed", "rollback": "rolled_back"}.get(e["action"],
                                                                                 "half")}
                for e in ends]

    @staticmethod
    def _answer(request: httpx.Request, obj: Any) -> httpx.Response:
        if "msgpack" in request.headers.get("accept", ""):
            return httpx.Response(200, content=msgpack.packb(obj, use_bin_type=True),
                                  headers={"content-type": "application/msgpack"})
        return httpx.Response(200, json=obj)


class Listener:
    def __init__(self) -> None:
        self.checked: list[str] = []

    async def execute_local_transaction(self, message: Message, arg: Any) -> TransactionState:
        await asyncio.sleep(0.001)
        if arg == "boom":
            raise RuntimeError("local failure")
        return TransactionState(arg)

    async def check_local_transaction(self, message: ReceivedMessage) -> TransactionState:
        self.checked.append(message.message_id)
        return TransactionState.COMMIT


def producer(fake: FakeTxBroker, listener: Any, **kw: Any) -> TransactionProducer:
    settings: dict[str, Any] = dict(broker_url=BROKER, linger_ms=5, check_wait_ms=100,
                                    transport=httpx.MockTransport(fake),
                                    heartbeat_interval_s=0.05)
    return TransactionProducer("orders-tx", listener, **{**settings, **kw})


async def test_concurrent_sends_and_ends_share_batch_requests() -> None:
    fake = FakeTxBroker()
    async with producer(fake, Listener()) as p:
        args = ["commit", "rollback", "unknown", "boom"] * 10
        raw = await asyncio.gather(*(p.send(f"m{i}", a, topic="orders")
                                     for i, a in enumerate(args)), return_exceptions=True)
    # "boom" raises in execute: send ends it as UNKNOWN, then raises LocalTransactionError
    assert all(isinstance(r, LocalTransactionError) == (a == "boom")
               for r, a in zip(raw, args, strict=True))
    results = [r.result if isinstance(r, LocalTransactionError) else r for r in raw]
    assert len(fake.halves) <= 4 and sum(len(h["messages"]) for h in fake.halves) == 40
    assert len(fake.ends) <= 4
    sent = {e["transaction_id"]: e for body in fake.ends for e in body["ends"]}
    assert len(sent) == 40 and all(not e["from_check"] for e in sent.values())
    by_state = {r.local_state for r in results}
    assert by_state == {TransactionState.COMMIT, TransactionState.ROLLBACK,
                        TransactionState.UNKNOWN}
    boom = [r for r, a in zip(results, args, strict=True) if a == "boom"]
    assert all(r.local_state is TransactionState.UNKNOWN and isinstance(r.error, RuntimeError)
               for r in boom)
    assert all(sent[r.transaction_id]["action"] == "unknown" for r in boom)
    assert {h["producer_group"] for h in fake.halves} == {"orders-tx"}
    assert fake.left  # close() left the group at once


class RefusingTxBroker(FakeTxBroker):
    """A broker refusing a half batch's query parameters (400), as one from before half
    batches did."""

    refused = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/transactions" and request.url.params:
            self.refused += 1
            return httpx.Response(400, json={
                "code": "BAD_REQUEST", "message": "producer_group: unknown query parameter; "
                "this endpoint takes no query parameters"})
        return await super().__call__(request)


async def test_a_half_message_is_a_batch_record_and_a_delayed_one_msgpack() -> None:
    fake = FakeTxBroker()
    async with producer(fake, Listener()) as p:
        await p.send("m0", "commit", topic="orders")
        await p.send(Message("m1", delay_ms=60_000), "commit", topic="orders")
    assert fake.kinds == [CONTENT_BATCH, "application/msgpack"]  # a half record has no delay
    assert fake.halves[1]["messages"][0]["delay_ms"] == 60_000


async def test_a_refused_half_batch_is_not_sent_another_way() -> None:
    """No fallback (issue 30): brokers of this repository take half batches."""
    fake = RefusingTxBroker()
    async with producer(fake, Listener()) as p:
        with pytest.raises(BadRequestError, match="unknown query parameter"):
            await p.send("m0", "commit", topic="orders")
    assert fake.refused == 1 and fake.halves == []


async def test_ends_nobody_waits_for_ride_with_the_next_half_messages() -> None:
    fake = FakeTxBroker()
    # A linger no test outlasts, and one half message per request: a half goes at once (the
    # batch is full), an end waits for the next half or for close(), whatever the load.
    async with producer(fake, Listener(), wait_for_end=False, linger_ms=600_000,
                        max_batch=1) as p:
        results = []
        for i in range(5):  # an end that went at once would go alone before the next send
            results.append(await p.send(f"m{i}", "commit", topic="orders"))
            await asyncio.sleep(0.01)
    ended = [e["transaction_id"] for body in fake.ends for e in body["ends"]]
    assert sorted(ended) == sorted(r.transaction_id for r in results)  # every end was sent
    # ends 1-4 went out with halves 2-5 (beside each half batch), not on their own before;
    # close() sent the last one alone
    riding = [([e["transaction_id"] for e in body["ends"]], body["after_halves"])
              for body in fake.ends]
    assert riding == [([r.transaction_id], i + 2) for i, r in enumerate(results[:4])] + \
        [([results[4].transaction_id], 5)]
    assert len(fake.halves) == 5 and len(fake.ends) == 5


async def test_checks_are_answered_in_a_batch_from_check() -> None:
    fake = FakeTxBroker()
    fake.checks = [{"transaction_id": f"old{i}", "message_id": f"mid{i}", "topic": "orders",
                    "check_times": 1,
                    "message": {"message_id": f"mid{i}", "topic": "orders", "body": b"x"}}
                   for i in range(3)]
    listener = Listener()
    async with producer(fake, listener) as p:
        deadline = time.monotonic() + 5
        while p.checks_answered < 3:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
    assert sorted(listener.checked) == ["mid0", "mid1", "mid2"]
    [answer] = [body for body in fake.ends if body["ends"][0]["from_check"]]
    assert [(e["transaction_id"], e["action"]) for e in answer["ends"]] == \
        [("old0", "commit"), ("old1", "commit"), ("old2", "commit")]
    assert fake.heartbeats >= 1


# --- the outbox listener on SQLite ----------------------------------------------------------

META = MetaData()
ORDERS = Table("orders", META, Column("id", Integer, primary_key=True),
               Column("note", String(32)))


@pytest.fixture
async def outbox(tmp_path: Path) -> Any:
    listener = OutboxListener(f"sqlite+aiosqlite:///{tmp_path / 'shop.db'}",
                              assume_rolled_back_after_s=60)
    await listener.create_table()
    async with listener.engine.begin() as conn:
        await conn.run_sync(META.create_all)
    yield listener
    await listener.close()


def received(mid: str, born_ms: int) -> ReceivedMessage:
    return ReceivedMessage(message_id=mid, topic="orders", queue_id=0, queue_offset=0,
                           body=b"", born_timestamp_ms=born_ms)


async def test_outbox_records_the_message_with_the_business_change(outbox: Any) -> None:
    async def business(conn: AsyncConnection, message: Message) -> None:
        await conn.execute(ORDERS.insert().values(note=message.message_id))

    state = await outbox.execute_local_transaction(Message("x", topic="orders",
                                                           message_id="m1"), business)
    assert state is TransactionState.COMMIT
    async with outbox.engine.connect() as conn:
        assert (await conn.execute(select(ORDERS.c.note))).all() == [("m1",)]
    now = now_ms()
    assert await outbox.check_local_transaction(received("m1", now)) is TransactionState.COMMIT


async def test_outbox_rolls_back_both_and_answers_checks_by_age(outbox: Any) -> None:
    async def failing(conn: AsyncConnection, message: Message) -> None:
        await conn.execute(ORDERS.insert().values(note="never"))
        raise ValueError("out of stock")

    with pytest.raises(LocalTransactionFailed) as caught:
        await outbox.execute_local_transaction(Message("x", topic="orders", message_id="m2"),
                                               failing)
    assert isinstance(caught.value.__cause__, ValueError)
    async with outbox.engine.connect() as conn:
        assert (await conn.execute(select(ORDERS.c.note))).all() == []
    now = now_ms()
    assert await outbox.check_local_transaction(received("m2", now)) is \
        TransactionState.UNKNOWN  # might still be running somewhere
    assert await outbox.check_local_transaction(received("m2", now - 61_000)) is \
        TransactionState.ROLLBACK
    assert await outbox.purge(0) == 0


async def test_a_failed_local_transaction_rolls_the_message_back_at_once() -> None:
    fake = FakeTxBroker()

    class Failing:
        async def execute_local_transaction(self, message: Message, arg: Any
                                            ) -> TransactionState:
            raise LocalTransactionFailed("rolled back") from KeyError("no such order")

        async def check_local_transaction(self, message: ReceivedMessage
                                          ) -> TransactionState:
            return TransactionState.ROLLBACK

    async with producer(fake, Failing()) as p:
        with pytest.raises(LocalTransactionError) as caught:
            await p.send("m", topic="orders")
    result = caught.value.result
    assert result.local_state is TransactionState.ROLLBACK
    assert isinstance(result.error, KeyError)
    assert fake.ends[0]["ends"][0]["action"] == "rollback"
