"""Transactional messages: the names, states and pure record builders the broker uses.

Records (docs/architecture.md#transactional-messages), all written through one
``Appender.append`` per request so that a state change, its op record and its event are durable
together:

- **half copy**: topic ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0, sys_flag NONE (so it is dispatched
  into the half queue, which the checker walks), the real topic and queue in ``REAL_TOPIC`` /
  ``REAL_QID``, the producer group in ``PGROUP``, the transaction id in ``TRANSACTION_ID`` *and*
  in ``KEYS`` (so ``find_by_key(HALF, txid)`` finds every copy), the check count in
  ``TRANSACTION_CHECK_TIMES``. The checker re-puts a copy per check: the newest is the live one.
- **commit copy**: the message in its real topic and queue, sys_flag COMMIT, ``TRANSACTION_ID``
  kept (hidden from clients), ``prepared_tx_offset`` = the first half copy's physical offset.
  A half this run stored from a producer's batch has its copy written from the half's stored
  bytes (``batches.CommitCopies``); any other half (a JSON/msgpack one, one read back from the
  log) through ``commit_copy``: the same record either way.
- **op record**: topic ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` queue 0; the body a msgpack list of
  ``[txid, action, source]``. Many ends share one op record (RocketMQ 5's batched op messages),
  so the checker reads few op records per scan. ``KEYS`` = the ids of the rolled-back and
  discarded ones (``find_by_key(OP, txid)``); a commit is found by its commit copy instead.
- **discard copy**: the message in ``TRANS_CHECK_MAX_TIME_TOPIC`` (never delivered).
- **event**: one record per state change in ``TIDE_SYS_TRANS_EVENTS`` with the fixed JSON body
  of docs/api.md#system-topics (``event_record``; the hot writes, halves of a producer's batch
  and ends, make the same records as a batch at once: ``batches.EventBatches``).
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import msgpack
import orjson
from tidemq.protocol import (
    BORN_MS,
    CHECK_IMMUNITY_TIME_IN_SECONDS,
    DELAY,
    DELAY_MS,
    KEYS,
    PGROUP,
    REAL_QID,
    REAL_TOPIC,
    TAGS,
    TIMER_DELIVER_MS,
    TRANSACTION_CHECK_TIMES,
    TRANSACTION_ID,
    UNIQ_KEY,
    EventKind,
    EventSource,
    SystemTopic,
    make_event,
)

from tidemq_server.broker.store.types import (
    KEY_SEPARATOR,
    MessageRecord,
    StoredRecord,
    SysFlag,
    tag_code,
)

HALF_TOPIC = SystemTopic.TRANS_HALF.value
OP_TOPIC = SystemTopic.TRANS_OP_HALF.value
DISCARD_TOPIC = SystemTopic.TRANS_CHECK_MAX.value
EVENTS_TOPIC = SystemTopic.TRANS_EVENTS.value

#: Properties that only half copies carry; a commit copy drops them.
HALF_ONLY = frozenset({REAL_TOPIC, REAL_QID, TRANSACTION_CHECK_TIMES,
                       CHECK_IMMUNITY_TIME_IN_SECONDS, BORN_MS, DELAY, DELAY_MS, TIMER_DELIVER_MS})

#: ``HALF_ONLY`` as the property names of stored bytes (what ``CommitCopies`` drops).
HALF_ONLY_NAMES = frozenset(name.encode() for name in HALF_ONLY)
MAX_OP_ENTRIES = 512  # ended transactions per op record (KEYS must stay under 64 KiB)
_TYPE_MASK = int(SysFlag.TYPE_MASK)
_COMMIT = int(SysFlag.COMMIT)


class TxState(StrEnum):
    HALF = "half"  # stored, invisible; also after "unknown"
    COMMITTED = "committed"  # re-put into its real topic: consumable
    ROLLED_BACK = "rolled_back"  # never delivered
    DISCARDED = "discarded"  # checked too often or too old: never delivered

    @property
    def ended(self) -> bool:
        return self is not TxState.HALF


class TxAction(StrEnum):
    COMMIT = "commit"
    ROLLBACK = "rollback"
    UNKNOWN = "unknown"
    DISCARD = "discard"  # the checker's, never a producer's

    @property
    def final_state(self) -> TxState:
        return _FINAL[self]


_FINAL = {TxAction.COMMIT: TxState.COMMITTED, TxAction.ROLLBACK: TxState.ROLLED_BACK,
          TxAction.UNKNOWN: TxState.HALF, TxAction.DISCARD: TxState.DISCARDED}


_RUN = uuid.uuid4().hex[:16]  # random per broker process: ids never repeat across restarts
_SEQ = itertools.count(1)


def new_transaction_id() -> str:
    """Opaque, unique, URL-safe: 32 hex characters (a random run prefix and a sequence)."""
    return f"{_RUN}{next(_SEQ):016x}"


@dataclass(slots=True)
class TxInfo:
    """What the broker knows of one transaction (in memory; rebuilt from the store on demand)."""

    txid: str
    message_id: str
    group: str
    topic: str  # the real topic
    first_offset: int  # physical offset of the first half copy
    latest_offset: int  # physical offset of the newest half copy (the live one)
    latest_size: int
    check_times: int
    born_ms: int
    state: TxState = TxState.HALF
    # [from, to) of the log a load could not see (above the high-water mark then): None when
    # what memory holds covers the whole log (see TxTable.ensure)
    unseen: tuple[int, int] | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"transaction_id": self.txid, "message_id": self.message_id, "topic": self.topic,
                "producer_group": self.group, "check_times": self.check_times,
                "born_timestamp_ms": self.born_ms, "state": self.state.value}


def info_from_half(txid: str, first: StoredRecord, latest: StoredRecord) -> TxInfo:
    props = latest.properties
    return TxInfo(
        txid=txid, message_id=first.message_id, group=props.get(PGROUP, ""),
        topic=props.get(REAL_TOPIC, ""), first_offset=first.physical_offset,
        latest_offset=latest.physical_offset, latest_size=latest.size,
        check_times=check_times_of(latest), born_ms=born_ms_of(first),
    )


def check_times_of(record: StoredRecord) -> int:
    try:
        return int(record.properties.get(TRANSACTION_CHECK_TIMES, "0"))
    except ValueError:
        return 0


def born_ms_of(record: StoredRecord) -> int:
    try:
        return int(record.properties.get(BORN_MS, "")) if BORN_MS in record.properties \
            else record.store_timestamp
    except ValueError:
        return record.store_timestamp


def is_commit_copy(record: StoredRecord, txid: str) -> bool:
    return (record.topic not in (HALF_TOPIC, DISCARD_TOPIC)
            and (record.sys_flag & _TYPE_MASK) == _COMMIT
            and record.properties.get(TRANSACTION_ID) == txid)


def user_keys(record: StoredRecord, txid: str) -> list[str]:
    """The message's own keys: the half copy's KEYS without the transaction id."""
    return [k for k in record.keys if k != txid]


# --- re-puts of a half copy -------------------------------------------------------------------

def half_copy(half: StoredRecord | MessageRecord, check_times: int) -> MessageRecord:
    """A new half copy (a check or a deferral): the same message, ``check_times`` checks. A
    first copy stored without ``BORN_MS`` (a producer's batch) was born when it was stored:
    its copies say so (their own store time is not their birth)."""
    props = dict(half.properties)
    props[TRANSACTION_CHECK_TIMES] = str(check_times)
    if BORN_MS not in props and isinstance(half, StoredRecord):
        props[BORN_MS] = str(half.store_timestamp)
    return MessageRecord(topic=HALF_TOPIC, queue_id=0, body=half.body, properties=props,
                         born_timestamp=half.born_timestamp, born_host=half.born_host)


def commit_copy(half: StoredRecord | MessageRecord, info: TxInfo, tag_code: int
                ) -> MessageRecord:
    """The record that makes the message consumable in its real topic and queue (``half``: a
    stored half copy, or the record this run wrote)."""
    props = {k: v for k, v in half.properties.items() if k not in HALF_ONLY}
    raw = half.properties.get(KEYS)
    keys = [k for k in raw.split(KEY_SEPARATOR) if k != info.txid] if raw else []
    if keys:
        props[KEYS] = KEY_SEPARATOR.join(keys)
    else:
        props.pop(KEYS, None)
    try:
        queue_id = int(half.properties.get(REAL_QID, "0"))
    except ValueError:
        queue_id = 0
    return MessageRecord(topic=info.topic, queue_id=queue_id, body=half.body, properties=props,
                         tag_code=tag_code, sys_flag=_COMMIT, born_timestamp=half.born_timestamp,
                         born_host=half.born_host, prepared_tx_offset=info.first_offset)


def discard_copy(half: StoredRecord | MessageRecord) -> MessageRecord:
    """The message kept in ``TRANS_CHECK_MAX_TIME_TOPIC``: visible, never delivered."""
    return MessageRecord(topic=DISCARD_TOPIC, queue_id=0, body=half.body,
                         properties=dict(half.properties), born_timestamp=half.born_timestamp,
                         born_host=half.born_host)


# --- op records ---------------------------------------------------------------------------------

OpEntry = tuple[str, str, str]  # (txid, action, source)
_COMMIT_ACTION = "commit"


def op_records(entries: list[OpEntry], now_ms: int) -> list[MessageRecord]:
    """Op records for ``entries``, ``MAX_OP_ENTRIES`` per record, keyed by the transaction ids
    that did not commit (a commit's durable mark is its commit copy, found by message id)."""
    out = []
    for i in range(0, len(entries), MAX_OP_ENTRIES):
        chunk = entries[i:i + MAX_OP_ENTRIES]
        body = msgpack.packb([list(e) for e in chunk], use_bin_type=True)
        props = {UNIQ_KEY: f"op-{new_transaction_id()}"}
        keyed = [e[0] for e in chunk if e[1] != _COMMIT_ACTION]
        if keyed:
            props[KEYS] = KEY_SEPARATOR.join(keyed)
        out.append(MessageRecord(topic=OP_TOPIC, queue_id=0, body=body, properties=props,
                                 born_timestamp=now_ms))
    return out


def decode_op(record: StoredRecord) -> list[OpEntry]:
    """The entries of an op record; [] for a record that is not one (never raises)."""
    try:
        items = msgpack.unpackb(record.body, raw=False)
        return [(str(e[0]), str(e[1]), str(e[2])) for e in items]
    except (ValueError, TypeError, IndexError, msgpack.UnpackException):
        return []


# --- events -------------------------------------------------------------------------------------

_EVENT_TAGS = {kind: tag_code(kind.value) for kind in EventKind}
_EVENT_PROPS = {kind: {TAGS: kind.value} for kind in EventKind}  # shared: never mutated


def event_record(kind: EventKind, source: EventSource, info: TxInfo, ts_ms: int
                 ) -> MessageRecord:
    """One event in the fixed schema of docs/api.md#system-topics (the metrics job's input)."""
    body = orjson.dumps(make_event(
        kind, source=source, producer_group=info.group, topic=info.topic,
        transaction_id=info.txid, message_id=info.message_id, check_times=info.check_times,
        born_ms=info.born_ms, ts_ms=ts_ms))
    return MessageRecord(topic=EVENTS_TOPIC, queue_id=0, body=body,
                         properties=_EVENT_PROPS[kind], tag_code=_EVENT_TAGS[kind],
                         born_timestamp=ts_ms)


def event_for(action: TxAction) -> EventKind:
    return _EVENT_OF[action]


_EVENT_OF = {action: EventKind(action.value) for action in TxAction}  # an Enum call is slow
