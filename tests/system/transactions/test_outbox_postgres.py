"""The outbox listener on a real PostgreSQL through asyncpg (tests/support/postgres.py), with a
broker and checker: a local transaction that commits publishes once, one that rolls back never,
a producer killed between the local commit and the end is committed by the check-back (another
instance finds the row), old rows are purged, and many concurrent writers each publish exactly
their own message."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, insert
from sqlalchemy.ext.asyncio import AsyncConnection
from tidemq import Message, ReceivedMessage, TransactionProducer, TransactionState
from tidemq.outbox import OutboxListener

from tests.support.postgres import PostgresServer
from tests.support.transactions import (
    Cluster,
    Producer,
    delivered,
    pending,
    sent_of,
    state_of,
    unique,
)
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def pg(postgres_server: PostgresServer) -> str:
    """The SQLAlchemy URL of an empty database of this test."""
    return postgres_server.url(postgres_server.database())


async def rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        return [tuple(r) for r in await conn.fetch(sql)]
    finally:
        await conn.close()


async def test_a_committed_local_transaction_publishes_once(cluster: Cluster, pg: str) -> None:
    b = cluster.broker
    topic, group = b.create_topic(queues=2), unique("G")
    p = Producer(b, group, cluster.workdir, "--topic", topic, "--count", "3", "--outbox-url", pg)
    sent = sent_of(p)
    assert p.stop() == 0, p.stderr()
    assert {s["local_state"] for s in sent} == {"commit"}
    mids = sorted(s["message_id"] for s in sent)
    assert sorted(r[0] for r in await rows(pg, "select message_id from orders")) == mids
    assert sorted(r[0] for r in await rows(pg, "select message_id from tidemq_outbox")) == mids
    wait_until(lambda: len(delivered(b, topic, 2)) == 3, what="delivery")
    cluster.checker.scan()  # a scan after the ends changes nothing: each was delivered once
    assert sorted(m["message_id"] for m in delivered(b, topic, 2)) == mids
    assert pending(b, group) == []


async def test_a_rolled_back_local_transaction_never_publishes(cluster: Cluster,
                                                               pg: str) -> None:
    b = cluster.broker
    topic, group = b.create_topic(queues=1), unique("G")
    p = Producer(b, group, cluster.workdir, "--topic", topic, "--count", "2", "--outbox-url", pg,
                 "--fail-business")
    sent = sent_of(p)
    assert p.stop() == 0, p.stderr()
    assert {s["local_state"] for s in sent} == {"rollback"}
    assert await rows(pg, "select * from orders") == []  # rolled back with the message
    assert await rows(pg, "select * from tidemq_outbox") == []
    assert {state_of(b, s["message_id"]) for s in sent} == {"rolled_back"}
    cluster.checker.scan()
    assert delivered(b, topic, 1) == []


async def test_a_producer_killed_after_the_local_commit_is_committed_by_the_check(
        cluster: Cluster, pg: str) -> None:
    b = cluster.broker
    topic, group = b.create_topic(queues=1), unique("G")
    crashing = Producer(b, group, cluster.workdir, "--topic", topic, "--count", "1",
                        "--outbox-url", pg, "--crash-after-local-commit", "--immunity", "1")
    [committed] = [x["local_commit"] for x in crashing.wait_for(
        lambda ls: any("local_commit" in x for x in ls)) if "local_commit" in x]
    crashing.proc.wait(10)
    assert await rows(pg, "select message_id from orders") == [(committed,)]
    assert state_of(b, committed) == "half"  # the end never left the dead process
    other = Producer(b, group, cluster.workdir, "--outbox-url", pg, "--serve", "-1")
    try:
        wait_until(lambda: state_of(b, committed) == "committed", timeout=30,
                   what="the check answered from the outbox table")
        assert [m["message_id"] for m in delivered(b, topic, 1)] == [committed]
        answers = {x["check"]: x["answer"] for x in other.lines() if "check" in x}
        assert answers[committed] == "commit"
    finally:
        other.kill()


async def test_purge_deletes_only_rows_older_than_asked(pg: str) -> None:
    outbox = OutboxListener(pg)
    try:
        await outbox.create_table()
        now_ms = int(time.time() * 1000)
        async with outbox.engine.begin() as conn:
            await conn.execute(insert(outbox.table), [
                {"message_id": f"old-{i}", "topic": "T", "created_ms": now_ms - 7_200_000}
                for i in range(3)] + [
                {"message_id": f"new-{i}", "topic": "T", "created_ms": now_ms} for i in range(2)])
        assert await outbox.purge(older_than_s=3600) == 3
        assert sorted(r[0] for r in await rows(pg, "select message_id from tidemq_outbox")) \
            == ["new-0", "new-1"]
        assert await outbox.purge(older_than_s=3600) == 0
    finally:
        await outbox.close()


WRITERS = 200


async def test_many_concurrent_writers_each_publish_exactly_their_message(
        cluster: Cluster, pg: str) -> None:
    b = cluster.broker
    topic, group = b.create_topic(queues=4), unique("G")
    metadata = MetaData()
    orders = Table("orders", metadata, Column("id", Integer, primary_key=True),
                   Column("message_id", String(64), nullable=False, unique=True))
    outbox = OutboxListener(pg)
    await outbox.create_table()
    async with outbox.engine.begin() as conn:
        await conn.run_sync(metadata.create_all)

    async def create_order(conn: AsyncConnection, message: Message) -> None:
        await conn.execute(orders.insert().values(message_id=message.message_id))

    try:
        async with TransactionProducer(group, outbox, broker_url=b.url,
                                       heartbeat_interval_s=1.0) as producer:
            results = await asyncio.gather(*(
                producer.send(Message(f"order {i}".encode(), topic=topic), arg=create_order)
                for i in range(WRITERS)))
    finally:
        await outbox.close()
    mids = sorted(r.message_id for r in results)
    assert len(set(mids)) == WRITERS
    assert {r.local_state for r in results} == {TransactionState.COMMIT}
    assert sorted(r[0] for r in await rows(pg, "select message_id from orders")) == mids
    assert sorted(r[0] for r in await rows(pg, "select message_id from tidemq_outbox")) == mids
    wait_until(lambda: len(delivered(b, topic, 4)) == WRITERS, what="delivery")
    assert sorted(m["message_id"] for m in delivered(b, topic, 4)) == mids
    # any instance sharing the database answers a check from the table
    other = OutboxListener(pg)
    try:
        answer = await other.check_local_transaction(ReceivedMessage(
            message_id=mids[0], topic=topic, queue_id=0, queue_offset=0, body=b""))
        assert answer is TransactionState.COMMIT
    finally:
        await other.close()
