"""An operator's word on a discarded transaction: commit it after all, or drop it for good.

The checker discards a half message it checked too often (or that grew too old); RocketMQ
users ask for a way to decide those by hand. ``resolve`` is that way, apart from the producer's
``end``: it accepts only a transaction in state ``discarded`` and leaves that state as it is
(the checker did give up), recording the operator's decision next to it:

- ``commit``: the commit copy goes into the real topic and queue (a delay on the message counts
  from now), so the message becomes consumable; its state (``GET /v1/messages/{id}``) reads
  ``committed``;
- ``drop``: nothing is delivered; the decision is kept so that the console shows the discarded
  message as handled.

The decision is an op record (topic ``RMQ_SYS_TRANS_OP_HALF_TOPIC``, keyed by the transaction
id, action ``resolve_commit`` or ``resolve_drop``, source ``admin``), written in the same store
write as the commit copy; readers of op records that do not know these actions skip them. No
transaction event is written: the metrics keep counting the transaction as discarded.
Resolving again with the same action answers the same; the other action is
``409 TRANSACTION_ALREADY_ENDED``.
"""

from __future__ import annotations

import asyncio
from enum import StrEnum
from typing import Any

from tidemq.protocol import ErrorCode, ProtocolError

from tidemq_server.broker.store.types import MessageRecord
from tidemq_server.broker.transactions.model import OP_TOPIC, TxInfo, TxState, decode_op, op_records
from tidemq_server.broker.transactions.service import TransactionService
from tidemq_server.common.clock import now_ms

ADMIN_SOURCE = "admin"  # the op record's source of an operator's decision
MAX_OPS_READ = 64  # op records of one transaction looked at for its resolution


class Resolution(StrEnum):
    COMMITTED = "committed"
    DROPPED = "dropped"


ACTIONS = {"commit": Resolution.COMMITTED, "drop": Resolution.DROPPED}
OP_ACTION = {Resolution.COMMITTED: "resolve_commit", Resolution.DROPPED: "resolve_drop"}
_OF_OP = {v: k for k, v in OP_ACTION.items()}


def resolution_of(tx: TransactionService, txid: str) -> Resolution | None:
    """The operator's decision on a discarded transaction, from its op records (None: none)."""
    for op in tx.store.find_by_key(OP_TOPIC, txid, max_count=MAX_OPS_READ):
        for entry_txid, action, _source in decode_op(op):
            if entry_txid == txid and action in _OF_OP:
                return _OF_OP[action]
    return None


def find(tx: TransactionService, txid: str, group: str | None = None) -> TxInfo:
    info = tx.table.ensure(txid)
    if info is None:
        raise ProtocolError(ErrorCode.TRANSACTION_NOT_FOUND,
                            f"no transaction {txid!r} on this broker (unknown id, or its half "
                            "message is past retention)")
    if group is not None and info.group != group:
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"transaction {txid} belongs to producer "
                            f"group {info.group!r}, not {group!r}")
    return info


def describe(tx: TransactionService, txid: str) -> dict[str, Any]:
    """``GET /v1/transactions/{id}``: the transaction in any state, with its resolution."""
    info = find(tx, txid)
    wire = info.to_wire()
    wire["resolution"] = (resolution_of(tx, txid) if info.state is TxState.DISCARDED else None)
    return wire


async def resolve(tx: TransactionService, txid: str, action: str, group: str | None
                  ) -> dict[str, Any]:
    """Commit or drop a discarded transaction (see the module docstring)."""
    want = ACTIONS.get(action)
    if want is None:
        raise ProtocolError(ErrorCode.BAD_REQUEST,
                            f'action must be "commit" or "drop", got {action!r}')
    task = asyncio.ensure_future(_resolve_locked(tx, txid, want, group))
    return await asyncio.shield(task)  # a client hanging up cannot tear the write


async def _resolve_locked(tx: TransactionService, txid: str, want: Resolution,
                          group: str | None) -> dict[str, Any]:
    taken = await tx.locks.acquire([txid])
    try:
        info = find(tx, txid, group)
        if info.state is TxState.HALF:
            raise ProtocolError(ErrorCode.BAD_REQUEST,
                                f"transaction {txid} is pending, not discarded: its producer "
                                "ends it (POST /v1/transactions/{id}/end)")
        if info.state is not TxState.DISCARDED:
            raise ProtocolError(ErrorCode.TRANSACTION_ALREADY_ENDED,
                                f"transaction {txid} was {info.state.value} by its producer; "
                                "only a discarded one can be resolved")
        prior = resolution_of(tx, txid)
        if prior is not None and prior is not want:
            raise ProtocolError(ErrorCode.TRANSACTION_ALREADY_ENDED,
                                f"discarded transaction {txid} was already resolved: "
                                f"{prior.value}")
        if prior is None:
            now = now_ms()
            records: list[MessageRecord] = []
            if want is Resolution.COMMITTED:
                records.append(tx._commit_record(info, now))
            records += op_records([(txid, OP_ACTION[want], ADMIN_SOURCE)], now)
            await tx.write(records)
        return {"transaction_id": txid, "message_id": info.message_id,
                "state": info.state.value, "resolution": want.value}
    finally:
        tx.locks.release(taken)
