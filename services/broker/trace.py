"""A message's trace (``GET /v1/messages/{id}/trace``): every stored copy of it, each named by
what it was, with the transaction and delay it went through.

The broker finds every copy by message id (the index) and names each one: ``half`` (a half
copy: one more per check), ``discarded``, ``committed``, ``delayed`` (waiting for its time),
``cancelled``, ``delivered`` (stored in its topic after a delay), ``stored`` (a plain send),
``retry`` (a copy a consumer group sent back, waiting or in its retry topic) and ``dlq`` (with
``resent_as`` once an operator resent it: that copy is listed under ``resent``). The
transaction (check count, state, an operator's resolution) comes from the transaction table;
which consumer groups consumed the message is for the caller to tell from the groups' offsets
against ``consumable`` (the copy consumers read).
"""

from __future__ import annotations

from typing import Any

from tidemq.protocol import TRAN_MSG, TRANSACTION_ID, ProtocolError

from tidemq_server.broker.delays.routing import due_of
from tidemq_server.broker.messaging.query import QueryService, retry_history
from tidemq_server.broker.states import copy_kind
from tidemq_server.broker.store.types import StoredRecord
from tidemq_server.broker.transactions.model import (
    check_times_of,
)
from tidemq_server.broker.transactions.resolve import describe
from tidemq_server.broker.transactions.service import TransactionService
from tidemq_server.common.dlq import resent_id


def copy_entry(rec: StoredRecord, kind: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"kind": kind, "topic": rec.topic, "queue_id": rec.queue_id,
                             "queue_offset": rec.queue_offset,
                             "store_timestamp_ms": rec.store_timestamp}
    if kind == "half":
        entry["check_times"] = check_times_of(rec)
    elif kind == "delayed":
        entry["deliver_at_ms"] = due_of(rec)
    elif kind in ("retry", "dlq"):
        entry["reconsume_times"] = rec.reconsume_times
    return entry


def resent_copy(queries: QueryService, message_id: str, rec: StoredRecord
                ) -> dict[str, Any] | None:
    """Where the copy resent from DLQ entry ``rec`` is (tidemq_server.common.dlq), if it was."""
    rid = resent_id(message_id, rec.topic, rec.queue_id, rec.queue_offset)
    try:
        found = queries.copies(rid)
    except ProtocolError:  # not resent (or past retention)
        return None
    first = found[0]
    return {"message_id": rid, "topic": first.topic, "queue_id": first.queue_id,
            "queue_offset": first.queue_offset, "store_timestamp_ms": first.store_timestamp}


def trace(queries: QueryService, tx: TransactionService, message_id: str) -> dict[str, Any]:
    copies = queries.copies(message_id)  # 404 MESSAGE_NOT_FOUND
    shown, state = queries.copies_state(copies)
    txid = next((c.properties.get(TRANSACTION_ID, "") for c in reversed(copies)
                 if c.properties.get(TRAN_MSG) == "true" and c.properties.get(TRANSACTION_ID)),
                "")
    entries: list[dict[str, Any]] = []
    waited = False
    consumable: StoredRecord | None = None
    delay: dict[str, Any] | None = None
    resent: list[dict[str, Any]] = []
    for rec in copies:  # oldest first
        kind = copy_kind(rec, txid, waited)
        entries.append(copy_entry(rec, kind))
        if kind == "dlq" and (again := resent_copy(queries, message_id, rec)) is not None:
            entries[-1]["resent_as"] = again["message_id"]
            resent.append(again)
        if kind == "delayed":
            waited = True
            delay = {"deliver_at_ms": due_of(rec), "state": "scheduled"}
        elif kind == "cancelled" and delay is not None:
            delay["state"] = "cancelled"
        elif kind in ("stored", "committed", "delivered"):
            consumable = rec
            if kind == "delivered" and delay is not None:
                delay.update(state="delivered", delivered_ms=rec.store_timestamp)
    transaction = None
    if txid:
        try:
            transaction = describe(tx, txid)
        except ProtocolError:  # past retention: the copies still tell the story
            transaction = {"transaction_id": txid}
    return {
        "message_id": message_id, "topic": shown.topic, "state": state.value,
        "born_timestamp_ms": shown.born_timestamp, "transaction": transaction, "delay": delay,
        "consumable": None if consumable is None else {
            "topic": consumable.topic, "queue_id": consumable.queue_id,
            "queue_offset": consumable.queue_offset},
        "retries": retry_history(copies), "copies": entries, "resent": resent,
    }
