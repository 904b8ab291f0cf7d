"""A ready ``TransactionListener`` for the outbox pattern (needs ``pip install tidemq[outbox]``).

    outbox = OutboxListener("sqlite+aiosqlite:///shop.db")    # or any SQLAlchemy AsyncEngine
    await outbox.create_table()

    async def create_order(conn: AsyncConnection, message: Message) -> None:
        await conn.execute(orders.insert().values(id=42, status="created"))

    async with TransactionProducer("orders-tx", outbox,
                                   nameservers=["http://127.0.0.1:9876"]) as producer:
        await producer.send(Message(b"order 42 created", topic="orders"), arg=create_order)

``execute_local_transaction`` runs the business function and inserts a row for the message into
the outbox table *in the same local database transaction*, then commits: either both the business
change and the row are there, or neither. It answers COMMIT once that commit succeeded. A business
function that raises rolls the local transaction back, and the message is rolled back at once
(``LocalTransactionFailed``); a failure of the commit itself is UNKNOWN — the broker checks later.
Either way ``TransactionProducer.send`` then raises ``tidemq.LocalTransactionError`` whose
``__cause__`` is the original exception.

The message is fixed before the business function runs: ``send`` stores it as a half message
first, then runs the local transaction. So nothing the local transaction makes can go into the
body, keys or properties — not an id the database assigns on insert (autoincrement, ``SERIAL``,
``IDENTITY``). Allocate such a value before ``send`` and use it in both the message and the
insert: on PostgreSQL ``SELECT nextval('orders_id_seq')`` on a connection of its own (a
sequence value is never handed out twice, even if the order then rolls back), or a UUID made
in Python::

    async with outbox.engine.connect() as conn:
        order_id = await conn.scalar(text("SELECT nextval('orders_id_seq')"))

    async def create_order(conn: AsyncConnection, message: Message) -> None:
        await conn.execute(orders.insert().values(id=order_id, status="created"))

    await producer.send(Message(f"order {order_id} created".encode(), topic="orders"),
                        arg=create_order)

``check_local_transaction`` answers from the table: a row → COMMIT; no row while this process is
still running the local transaction → UNKNOWN; no row for a message born more than
``assume_rolled_back_after_s`` ago → ROLLBACK (no local transaction runs that long); else UNKNOWN.
Any instance of the producer group sharing the database answers the same way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

try:
    from sqlalchemy import BigInteger, Column, MetaData, String, Table, delete, insert, select
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("tidemq.outbox needs SQLAlchemy with asyncio support and a driver: "
                      "pip install 'tidemq[outbox]'") from exc

from tidemq._exceptions import LocalTransactionFailed
from tidemq._message import Message
from tidemq._transaction_types import TransactionState
from tidemq.protocol import ReceivedMessage

log = logging.getLogger("tidemq.outbox")

DEFAULT_URL = "sqlite+aiosqlite:///tidemq-outbox.db"
DEFAULT_TABLE = "tidemq_outbox"
ASSUME_ROLLED_BACK_AFTER_S = 60.0

#: The business change: runs inside the local transaction, on its connection.
LocalWork = Callable[[AsyncConnection, Message], Awaitable[Any]]


def outbox_table(name: str = DEFAULT_TABLE, metadata: MetaData | None = None) -> Table:
    """The outbox table: one row per message whose local transaction committed."""
    return Table(
        name, metadata if metadata is not None else MetaData(),
        Column("message_id", String(64), primary_key=True),
        Column("topic", String(127), nullable=False),
        Column("created_ms", BigInteger, nullable=False, index=True),
    )


class OutboxListener:
    def __init__(self, engine: AsyncEngine | str = DEFAULT_URL, *, table: str = DEFAULT_TABLE,
                 assume_rolled_back_after_s: float = ASSUME_ROLLED_BACK_AFTER_S) -> None:
        self.engine = create_async_engine(engine) if isinstance(engine, str) else engine
        self._owns_engine = isinstance(engine, str)
        self.table = outbox_table(table)
        self.assume_rolled_back_after_s = assume_rolled_back_after_s
        self._running: set[str] = set()  # message ids whose local transaction runs here

    async def create_table(self) -> None:
        """Create the outbox table if it does not exist."""
        async with self.engine.begin() as conn:
            await conn.run_sync(self.table.metadata.create_all)

    async def close(self) -> None:
        if self._owns_engine:
            await self.engine.dispose()

    async def execute_local_transaction(self, message: Message, arg: Any) -> TransactionState:
        """Run ``arg(conn, message)`` (a ``LocalWork``, or None) and record the message, in one
        local transaction."""
        mid = message.message_id
        if not mid:
            raise ValueError("the message has no message_id (the producer always sets one)")
        self._running.add(mid)
        failed: BaseException | None = None
        try:
            async with self.engine.begin() as conn:
                try:
                    if arg is not None:
                        await arg(conn, message)
                    await conn.execute(insert(self.table).values(
                        message_id=mid, topic=message.topic or "",
                        created_ms=int(time.time() * 1000)))
                except Exception as exc:
                    failed = exc
                    raise
        except Exception as exc:
            if exc is failed:  # raised inside: the local transaction was rolled back
                raise LocalTransactionFailed(f"local transaction of {mid} failed: {exc}") \
                    from exc
            raise  # the commit itself failed: its outcome is unknown
        finally:
            self._running.discard(mid)
        return TransactionState.COMMIT

    async def check_local_transaction(self, message: ReceivedMessage) -> TransactionState:
        mid = message.message_id
        if mid in self._running:
            return TransactionState.UNKNOWN
        async with self.engine.connect() as conn:
            row = (await conn.execute(select(self.table.c.message_id)
                                      .where(self.table.c.message_id == mid))).first()
        if row is not None:
            return TransactionState.COMMIT
        age_s = time.time() - message.born_timestamp_ms / 1000
        if message.born_timestamp_ms and age_s > self.assume_rolled_back_after_s:
            return TransactionState.ROLLBACK
        return TransactionState.UNKNOWN

    async def purge(self, older_than_s: float) -> int:
        """Delete outbox rows older than ``older_than_s`` (checks are long over); the count."""
        horizon = int((time.time() - older_than_s) * 1000)
        async with self.engine.begin() as conn:
            result = await conn.execute(delete(self.table)
                                        .where(self.table.c.created_ms < horizon))
        return int(result.rowcount or 0)
