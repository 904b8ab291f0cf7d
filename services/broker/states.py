"""What state a message is in, answered in one place from its stored copies (oldest first).

The state names are ``MessageState`` (messaging/query.py, beside the plain message's rule
``message_state``); every other rule that reads a state from the copies is here:

- ``delay_view``: a delayed message waiting (``scheduled``) or cancelled before delivery;
- ``transaction_view``: a transactional message (``half``, ``committed``, ``rolled_back``,
  ``discarded``), its state from the transaction table;
- ``delay_standing``: what a repeated send of a delayed message learns beyond its first result
  (cancelled, or stored where it was delivered);
- ``copy_kind``: what one copy is in a message's trace (``half``, ``delayed``, ``retry``, ...).

``QueryService`` asks the two views in order (delays first, then transactions) before the plain
rule; ``GET /v1/messages/{id}``, key and time queries and the trace all go through it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tidemq.protocol import KEYS, REAL_QID, REAL_TOPIC, TRAN_MSG, TRANSACTION_ID, is_system_topic
from tidemq.protocol.topics import DLQ_PREFIX

from tidemq_server.broker.delays.copies import Standing, by_topic
from tidemq_server.broker.delays.routing import (
    CANCELS_TOPIC,
    as_delivered_view,
    is_consumable,
    is_waiting,
)
from tidemq_server.broker.messaging.query import MessageState, is_retry_copy
from tidemq_server.broker.store.types import KEY_SEPARATOR, StoredRecord
from tidemq_server.broker.transactions.model import (
    DISCARD_TOPIC,
    HALF_TOPIC,
    TxInfo,
    TxState,
    is_commit_copy,
)

_STATE_VIEW = {TxState.HALF: MessageState.HALF, TxState.COMMITTED: MessageState.COMMITTED,
               TxState.ROLLED_BACK: MessageState.ROLLED_BACK,
               TxState.DISCARDED: MessageState.DISCARDED}


# --- delays -----------------------------------------------------------------------------------

def delay_view(copies: list[StoredRecord]) -> tuple[StoredRecord, MessageState] | None:
    """``(copy to show, SCHEDULED | CANCELLED)`` when the newest copy that matters is a
    waiting copy or a cancel record; None when delays have no say (a ``QueryService`` view).

    Copies in other system topics (transaction half/op records) do not matter here.
    """
    waiting: StoredRecord | None = None
    for rec in reversed(copies):
        if rec.topic == CANCELS_TOPIC:
            shown = next((c for c in reversed(copies) if is_waiting(c)), None)
            return as_delivered_view(shown or rec), MessageState.CANCELLED
        if is_waiting(rec):
            waiting = rec
            break
        if is_consumable(rec.topic):
            return None  # delivered (or never delayed): a real, retry or DLQ copy is newest
    if waiting is None:
        return None
    return as_delivered_view(waiting), MessageState.SCHEDULED


def delay_standing(copies: list[StoredRecord], topic: str | None = None
                   ) -> dict[str, Any] | None:
    """For a repeated send of a delayed message to ``topic``: ``{state: "cancelled"}``, or
    ``{state: "stored", queue_id, queue_offset}`` of its delivered copy; None while it waits.
    The same id in another topic is another message."""
    if topic is not None:
        mine = by_topic(copies).get(topic)
        if mine is None or mine.standing in (Standing.PENDING, Standing.PLAIN):
            return None
        if mine.standing is Standing.CANCELLED:
            return {"state": MessageState.CANCELLED.value}
        return {"state": MessageState.STORED.value, "queue_id": mine.newest.queue_id,
                "queue_offset": mine.newest.queue_offset}
    newest = _newest_that_matters(copies)
    if newest is None or is_waiting(newest):
        return None
    if newest.topic == CANCELS_TOPIC:
        return {"state": MessageState.CANCELLED.value}
    real = next((c.properties.get(REAL_TOPIC) for c in copies if is_waiting(c)), None)
    delivered = next((c for c in copies if c.topic == real), None)
    if delivered is None:
        return None
    return {"state": MessageState.STORED.value, "queue_id": delivered.queue_id,
            "queue_offset": delivered.queue_offset}


def _newest_that_matters(copies: list[StoredRecord]) -> StoredRecord | None:
    """The newest waiting copy, cancel record, or delivered/plain copy (transaction records
    and other system copies do not decide whether a delayed message can be cancelled)."""
    for rec in reversed(copies):
        if rec.topic == CANCELS_TOPIC or is_waiting(rec):
            return rec
        if is_consumable(rec.topic):
            return rec
    return None


# --- transactions -----------------------------------------------------------------------------

def transaction_view(copies: list[StoredRecord], ensure: Callable[[str], TxInfo | None]
                     ) -> tuple[StoredRecord, MessageState] | None:
    """The copy to show and the state of a transactional message (``ensure``: the
    transaction table's lookup by id); None for others (and for a committed one routed
    elsewhere, e.g. delayed: the delay view decides)."""
    tx = [c for c in copies if c.properties.get(TRAN_MSG) == "true"]
    if not tx:
        return None
    txid = tx[-1].properties.get(TRANSACTION_ID, "")
    commits = [c for c in tx if is_commit_copy(c, txid)]
    if commits:
        last = commits[-1]
        return None if is_system_topic(last.topic) else (last, MessageState.COMMITTED)
    info = ensure(txid)
    halves = [c for c in tx if c.topic == HALF_TOPIC and
              c.properties.get(TRANSACTION_ID) == txid]
    if info is None or not halves:
        return None
    shown = halves[-1]
    shown = dataclasses.replace(shown, topic=info.topic,
                                queue_id=int(shown.properties.get(REAL_QID, "0") or 0),
                                queue_offset=0,
                                properties={k: v for k, v in shown.properties.items()
                                            if k != KEYS} | _keys_prop(shown, txid))
    return shown, _STATE_VIEW[info.state]


def _keys_prop(record: StoredRecord, txid: str) -> dict[str, str]:
    keys = [k for k in record.keys if k != txid]
    return {KEYS: KEY_SEPARATOR.join(keys)} if keys else {}


# --- one copy in a trace ----------------------------------------------------------------------

def copy_kind(rec: StoredRecord, txid: str, after_wait: bool) -> str:
    """What ``rec`` is among a message's copies (``txid``: its transaction, if any;
    ``after_wait``: an earlier copy waited for a delay)."""
    if is_retry_copy(rec):
        return "dlq" if rec.topic.startswith(DLQ_PREFIX) else "retry"
    if rec.topic == HALF_TOPIC:
        return "half"
    if rec.topic == DISCARD_TOPIC:
        return "discarded"
    if rec.topic == CANCELS_TOPIC:
        return "cancelled"
    if is_waiting(rec):
        return "delayed"
    if txid and is_commit_copy(rec, txid) and not after_wait:
        return "committed"
    return "delivered" if after_wait else "stored"
