"""Pure checks of half messages sent as producer-made batches (``POST
/v1/transactions?producer_group=&topic=`` with ``application/x-tidemq-batch``), made before
anything is stored: no I/O, no state.

The SDK builds each half record as the log stores a half copy: topic ``RMQ_SYS_TRANS_HALF_TOPIC``,
queue 0, sys_flag 0, and the reserved properties of a half copy — ``TRAN_MSG`` ("true"),
``PGROUP`` (the request's group), ``REAL_TOPIC`` (the request's topic), ``REAL_QID`` (one of its
queues), ``TRANSACTION_ID`` (new, 1-64 letters, digits, ``-`` or ``_``) and optionally
``CHECK_IMMUNITY_TIME_IN_SECONDS`` — with the transaction id among its keys. No other reserved
property, no delay (a delayed half goes as JSON/msgpack). A failure is a ``BatchError`` naming
the batch, the record and the field.
"""

from __future__ import annotations

import re
from typing import Any

from tidemq.protocol import (
    CHECK_IMMUNITY_TIME_IN_SECONDS,
    KEYS,
    PGROUP,
    REAL_QID,
    REAL_TOPIC,
    SHARDING_KEY,
    TAGS,
    TRAN_MSG,
    TRANSACTION_ID,
    UNIQ_KEY,
    ErrorCode,
    ProtocolError,
    SystemTopic,
)
from tidemq.protocol.message import Limits
from tidemq.protocol.numbers import INT32_MAX
from tidemq.protocol.records.v2 import (
    KEY_SEPARATOR,
    PROPERTY_END,
    RECORD,
    RECORD_FIXED,
    decode_properties,
)
from tidemq.protocol.records.v2_read import BatchError, BatchSummary, split, validate

from tidemq_server.broker.ingest.checks import check_limits
from tidemq_server.broker.store.types import MessageRecord

HALF_TOPIC = SystemTopic.TRANS_HALF.value  # where a half copy is stored (transactions/model.py)
#: The reserved properties a half record may carry (and the sharding key any send may).
HALF_PROPERTIES = frozenset({TRAN_MSG, PGROUP, REAL_TOPIC, REAL_QID, TRANSACTION_ID,
                             CHECK_IMMUNITY_TIME_IN_SECONDS, SHARDING_KEY})
_REQUIRED = (TRAN_MSG, PGROUP, REAL_TOPIC, REAL_QID, TRANSACTION_ID)
_TXID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_END = PROPERTY_END.encode()


class BatchHalf:
    """A half record of a producer's batch, as its checks read it: enough to answer it and, as
    long as it is pending, to build its commit copy without decoding it again — from its
    stored bytes (``stored``: the record as the log holds it, ``store/records/v2_copy.py``)
    when its property names are distinct (``distinct``; else from ``record()``)."""

    __slots__ = ("at", "batch", "body_at", "born_timestamp", "distinct", "flag", "host",
                 "index", "message_id", "properties", "size", "stored", "txid")

    def __init__(self, batch: int, index: int, at: int, message_id: str, txid: str,
                 properties: dict[str, str], stored: bytes, body_at: int, flag: int,
                 born_timestamp: int, distinct: bool) -> None:
        self.batch, self.index, self.at = batch, index, at
        self.message_id, self.txid, self.properties = message_id, txid, properties
        self.stored, self.body_at, self.distinct = stored, body_at, distinct
        self.flag, self.born_timestamp = flag, born_timestamp
        self.size, self.host = 0, ""  # where it landed: set once stored

    @property
    def body(self) -> bytes:
        return self.stored[self.body_at:]

    def record(self) -> MessageRecord:
        """The half copy as a store record (``properties`` carries id, tag and keys)."""
        return MessageRecord(HALF_TOPIC, 0, self.body, dict(self.properties), 0, self.flag, 0,
                             self.born_timestamp, self.host)


def parse_halves(group: str, topic: str, raw: bytes, queues: int, limits: Limits
                 ) -> tuple[list[BatchSummary], list[BatchHalf]]:
    """Check every batch and half record of ``raw`` (a half request of ``group`` for
    ``topic``, ``queues`` queues); the summaries and the halves in order."""
    summaries: list[BatchSummary] = []
    halves: list[BatchHalf] = []
    seen: dict[str, int] = {}
    for k, (at, size) in enumerate(split(raw)):
        try:
            s = validate(raw, at, strict=True, allowed=HALF_PROPERTIES, limits=limits,
                         end=at + size)
            head = s.head
            if head.topic != HALF_TOPIC:
                raise BatchError("topic", f"{head.topic!r}: half messages go to "
                                 f"{HALF_TOPIC!r}")
            if head.queue_id != 0:
                raise BatchError("queue_id", f"{head.queue_id}: the half queue is 0")
            if head.sys_flag:
                raise BatchError("sys_flag", f"{head.sys_flag}: a half copy is stored "
                                 "with 0")
            if s.delayed:
                raise BatchError("delay_kind", "a delayed half message goes as JSON or "
                                 "msgpack", s.delayed[0])
            for i, pos in enumerate(s.positions):
                half = check_half_record(raw, k, i, at + pos, group, topic, queues,
                                          s.message_ids[i], s.keys[i])
                if half.txid in seen:
                    raise BatchError("properties.TRANSACTION_ID", f"{half.txid!r} is "
                                     f"also record {seen[half.txid]} of this request", i)
                seen[half.txid] = len(halves)
                halves.append(half)
        except BatchError as exc:
            raise BatchError(exc.field, exc.why, exc.index, exc.code, batch=k) from None
        summaries.append(s)
    if not summaries:
        raise ProtocolError(ErrorCode.BAD_REQUEST, "the body holds no batch")
    check_limits(summaries, limits)
    return summaries, halves

def check_half_record(raw: bytes, batch: int, i: int, p: int, group: str, topic: str,
                  queues: int, message_id: str, keys: str) -> BatchHalf:
    """The half record at ``raw[p:]`` (validated), its reserved properties checked."""
    (size, _, _, _, flag, _, born, _, _, _, _, id_len, tag_len, keys_len, props_len,
     _) = RECORD.unpack_from(raw, p)
    tag_at = p + RECORD_FIXED + id_len
    at = tag_at + tag_len + keys_len
    view = memoryview(raw)
    props = decode_properties(view[at:at + props_len])  # utf-8: validated
    distinct = raw.count(_END, at, at + props_len) == len(props)  # no name twice
    for name in _REQUIRED:
        if name not in props:
            raise BatchError(f"properties.{name}", "missing: a half record carries "
                             f"{', '.join(_REQUIRED)}", i)
    if props[TRAN_MSG] != "true":
        raise BatchError(f"properties.{TRAN_MSG}", f"{props[TRAN_MSG]!r}, must be 'true'",
                         i)
    if props[PGROUP] != group:
        raise BatchError(f"properties.{PGROUP}", f"{props[PGROUP]!r}, but the request is "
                         f"for producer group {group!r}", i)
    if props[REAL_TOPIC] != topic:
        raise BatchError(f"properties.{REAL_TOPIC}", f"{props[REAL_TOPIC]!r}, but the "
                         f"request is for topic {topic!r}", i)
    qid = props[REAL_QID]
    if not (qid.isdigit() and qid.isascii() and int(qid) < queues):
        raise BatchError(f"properties.{REAL_QID}", f"{qid!r} is not a queue of topic "
                         f"{topic!r} (0-{queues - 1})", i)
    txid = props[TRANSACTION_ID]
    if not _TXID.fullmatch(txid):
        raise BatchError(f"properties.{TRANSACTION_ID}", f"{txid!r}: 1-64 letters, "
                         "digits, '-' or '_'", i)
    if txid not in keys.split(KEY_SEPARATOR):
        raise BatchError("keys", f"must include the transaction id {txid!r}", i)
    immunity = props.get(CHECK_IMMUNITY_TIME_IN_SECONDS)
    if immunity is not None:
        try:
            value = float(immunity)
        except ValueError:
            value = -1.0
        if not 0 <= value <= INT32_MAX:  # NaN fails too
            raise BatchError(f"properties.{CHECK_IMMUNITY_TIME_IN_SECONDS}",
                             f"{immunity!r}: a number of seconds from 0 to {INT32_MAX}", i)
    props[UNIQ_KEY] = message_id  # as a store record holds them (entry.store_properties)
    if tag_len:
        props[TAGS] = str(view[tag_at:tag_at + tag_len], "utf-8")
    if keys:
        props[KEYS] = keys
    return BatchHalf(batch, i, p, message_id, txid, props, raw[p:p + size], at + props_len - p,
                     flag, born, distinct)


def batch_answer(txids: list[str], halves: list[BatchHalf]) -> dict[str, Any]:
    """The answer to stored half batches: ``{stored: n}`` when every record's own transaction
    id stands (the common case), else each record's transaction (a retried half answers the
    id of its first attempt)."""
    if all(t == h.txid for t, h in zip(txids, halves, strict=True)):
        return {"stored": len(halves)}
    return {"transactions": [{"transaction_id": t, "message_id": h.message_id}
                             for t, h in zip(txids, halves, strict=True)]}
