"""A transactional producer in its own process, for the integration tests.

    python tests/support/producer_proc.py --broker URL --group G [--topic T --count N]
        [--execute commit|rollback|unknown|raise] [--check commit|rollback|unknown]
        [--outbox DB | --outbox-url URL [--fail-business] [--crash-after-local-commit]]
        [--serve SECONDS]

Prints one JSON object per line: ``{"ready": true}`` once started, ``{"sent": {...}}`` per
message, ``{"check": message_id, "answer": state}`` per check answered, ``{"done": true}`` at
the end of its sends. It keeps answering checks for ``--serve`` seconds (-1: until killed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

from tidemq import (
    LocalTransactionError,
    Message,
    ReceivedMessage,
    TransactionProducer,
    TransactionState,
)


def emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


class Scripted:
    """Answers execute and check from the command line; ``raise`` raises in execute."""

    def __init__(self, execute: str, check: str) -> None:
        self.execute = execute
        self.check = check

    async def execute_local_transaction(self, message: Message, arg: Any) -> TransactionState:
        if self.execute == "raise":
            raise RuntimeError("the local transaction blew up")
        return TransactionState(self.execute)

    async def check_local_transaction(self, message: ReceivedMessage) -> TransactionState:
        emit({"check": message.message_id, "answer": self.check, "body": message.text,
              "at": time.time()})
        return TransactionState(self.check)


class LoggedOutbox:
    """The outbox listener, logging the checks it answers."""

    def __init__(self, url: str, crash_after_commit: bool) -> None:
        from tidemq.outbox import OutboxListener
        self.outbox = OutboxListener(url, assume_rolled_back_after_s=1.0)
        self.crash_after_commit = crash_after_commit

    async def execute_local_transaction(self, message: Message, arg: Any) -> TransactionState:
        state = await self.outbox.execute_local_transaction(message, arg)
        if self.crash_after_commit:
            emit({"local_commit": message.message_id})
            os._exit(9)  # the local transaction committed; the end never leaves this process
        return state

    async def check_local_transaction(self, message: ReceivedMessage) -> TransactionState:
        state = await self.outbox.check_local_transaction(message)
        emit({"check": message.message_id, "answer": state.value, "body": message.text})
        return state


async def main(args: argparse.Namespace) -> None:
    listener: Any
    business = None
    if args.outbox or args.outbox_url:
        from sqlalchemy import Column, Integer, MetaData, String, Table
        meta = MetaData()
        orders = Table("orders", meta, Column("id", Integer, primary_key=True),
                       Column("message_id", String(64)))
        listener = LoggedOutbox(args.outbox_url or f"sqlite+aiosqlite:///{args.outbox}",
                                args.crash_after_local_commit)
        await listener.outbox.create_table()
        async with listener.outbox.engine.begin() as conn:
            await conn.run_sync(meta.create_all)

        async def business(conn: Any, message: Message) -> None:
            await conn.execute(orders.insert().values(message_id=message.message_id))
            if args.fail_business:
                raise ValueError("business rule violated")
    else:
        listener = Scripted(args.execute, args.check)
    async with TransactionProducer(args.group, listener, broker_url=args.broker,
                                   heartbeat_interval_s=1.0, check_wait_ms=2000,
                                   check_immunity_s=args.immunity) as producer:
        emit({"ready": True, "client_id": producer.client_id})
        for i in range(args.count):
            try:
                result = await producer.send(Message(f"{args.body}-{i}", topic=args.topic,
                                                     keys=[f"k-{i}"]), arg=business)
            except LocalTransactionError as exc:  # execute raised: ended, then reported
                result = exc.result
            emit({"sent": {"message_id": result.message_id,
                           "transaction_id": result.transaction_id,
                           "local_state": result.local_state.value,
                           "error": repr(result.error) if result.error else None,
                           "end_error": repr(result.end_error) if result.end_error else None}})
        emit({"done": True})
        if args.serve < 0:
            await asyncio.Event().wait()
        await asyncio.sleep(args.serve)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--topic", default="")
    ap.add_argument("--count", type=int, default=0)
    ap.add_argument("--body", default="m")
    ap.add_argument("--execute", default="commit")
    ap.add_argument("--check", default="commit")
    ap.add_argument("--immunity", type=float, default=None)
    ap.add_argument("--outbox", default="", help="an SQLite file")
    ap.add_argument("--outbox-url", default="", help="any SQLAlchemy async URL")
    ap.add_argument("--fail-business", action="store_true")
    ap.add_argument("--crash-after-local-commit", action="store_true")
    ap.add_argument("--serve", type=float, default=0.0)
    asyncio.run(main(ap.parse_args()))
