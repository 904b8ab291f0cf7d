"""What producers send about transactions, parsed and turned into records (no I/O).

``parse_begin``/``batch_target``: what a half-message request names (JSON/msgpack body, or query
parameters beside half batches); ``parse_end``/``parse_ends``/``parse_group``: the bodies of the
end endpoints (and of ends riding along with half messages); ``half_record``: the half copy of
a validated message; ``delayed_message``: the delay a half message asked for, applied from its
commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
    TRAN_MSG,
    TRANSACTION_ID,
    UNIQ_KEY,
    ErrorCode,
    EventSource,
    OutgoingMessage,
    ProtocolError,
    validate_group_name,
)
from tidemq.protocol.message import reject_unknown
from tidemq.protocol.numbers import INT32_MAX, shown

from tidemq_server.broker.messaging.convert import to_record
from tidemq_server.broker.store.types import KEY_SEPARATOR, MessageRecord, StoredRecord
from tidemq_server.broker.transactions.model import HALF_TOPIC, TxAction

MAX_ENDS = 4096  # ends per batch request
PRODUCER_ACTIONS = (TxAction.COMMIT, TxAction.ROLLBACK, TxAction.UNKNOWN)
_ACTIONS = {a.value: a for a in PRODUCER_ACTIONS}


@dataclass(frozen=True, slots=True)
class EndRequest:
    txid: str
    action: TxAction
    from_check: bool = False

    @property
    def source(self) -> EventSource:
        return EventSource.CHECK if self.from_check else EventSource.PRODUCER


def parse_end(obj: Any, txid: str | None = None) -> EndRequest:
    """One end ``{transaction_id?, action, from_check}``; 400 BAD_REQUEST when malformed."""
    if not isinstance(obj, dict):
        raise ProtocolError(ErrorCode.BAD_REQUEST, "each end must be an object")
    txid = txid if txid is not None else obj.get("transaction_id")
    if not isinstance(txid, str) or not txid:
        raise ProtocolError(ErrorCode.BAD_REQUEST, "transaction_id must be a non-empty string")
    raw = obj.get("action")
    action = _ACTIONS.get(raw) if isinstance(raw, str) else None
    if action is None:
        action = _ACTIONS.get(str(raw).lower())
        if action is None:
            raise ProtocolError(ErrorCode.BAD_REQUEST, f"action must be 'commit', 'rollback' "
                                f"or 'unknown', got {raw!r}")
    from_check = obj.get("from_check", False)
    if not isinstance(from_check, bool):
        raise ProtocolError(ErrorCode.BAD_REQUEST, "from_check must be true or false")
    return EndRequest(txid, action, from_check)


END_FIELDS = frozenset({"transaction_id", "action", "from_check"})  # of one item of ``ends``


def parse_ends(items: Any, optional: bool = False) -> list[EndRequest]:
    """The ``ends`` of a batch end (or riding along with half messages)."""
    if items is None and optional:
        return []
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_ENDS:
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"ends must be a list of 1-{MAX_ENDS} "
                            "{transaction_id, action, from_check}")
    ends = []
    for i, item in enumerate(items):
        try:
            if isinstance(item, dict):
                reject_unknown(item, END_FIELDS, "an end")
            ends.append(parse_end(item))
        except ProtocolError as exc:
            raise ProtocolError(exc.code, f"ends[{i}]: {exc.message}") from None
    return ends


def parse_group(payload: Any, required: bool = True) -> str | None:
    group = payload.get("producer_group") if isinstance(payload, dict) else None
    if group is None and not required:
        return None
    if group is None:
        raise ProtocolError(ErrorCode.BAD_REQUEST, "producer_group is required: the producer "
                            "group that sent the half message")
    if not isinstance(group, str):
        raise ProtocolError(ErrorCode.BAD_REQUEST, "producer_group must be a string")
    return validate_group_name(group)


def parse_begin(payload: Any) -> tuple[str, str, bool, float | None]:
    """A ``POST /v1/transactions`` body: its producer group, topic, whether it holds one
    ``message`` (else ``messages``) and its ``check_immunity_s``; 400 BAD_REQUEST when
    malformed (the messages themselves are parsed as a send's)."""
    if not isinstance(payload, dict):
        raise ProtocolError(ErrorCode.BAD_REQUEST, "the body must be an object")
    group = parse_group(payload)
    assert group is not None
    topic = payload.get("topic")
    if not isinstance(topic, str):
        raise ProtocolError(ErrorCode.BAD_REQUEST, "topic must be a string")
    single = "message" in payload
    if single == ("messages" in payload):
        raise ProtocolError(ErrorCode.BAD_REQUEST,
                            "give either message (one) or messages (a list), not both")
    immunity = payload.get("check_immunity_s")
    if immunity is not None and (isinstance(immunity, bool)
                                 or not isinstance(immunity, int | float)
                                 or not 0 <= immunity <= INT32_MAX):  # NaN fails too
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"check_immunity_s must be a number of "
                            f"seconds from 0 to {INT32_MAX}, got {shown(immunity)}")
    return group, topic, single, immunity


def batch_target(group: str | None, topic: str | None) -> tuple[str, str]:
    """The producer group and topic of half batches (query parameters), both required."""
    if group is None:
        raise ProtocolError(ErrorCode.BAD_REQUEST, "producer_group is required (a query "
                            "parameter with a batch body)")
    group = validate_group_name(group)
    if topic is None:
        raise ProtocolError(ErrorCode.BAD_REQUEST, "topic is required (a query parameter "
                            "with a batch body)")
    return group, topic


def half_record(msg: OutgoingMessage, group: str, topic: str, queue_id: int, mid: str,
                txid: str, immunity: float | None, host: str, now: int) -> MessageRecord:
    """The half copy a validated message is stored as (invisible, in the half queue)."""
    record = to_record(msg, topic, queue_id, mid, now, host)
    props = record.properties
    props[KEYS] = KEY_SEPARATOR.join([*msg.keys, txid])
    props.update({REAL_TOPIC: topic, REAL_QID: str(queue_id), TRAN_MSG: "true",
                  PGROUP: group, TRANSACTION_ID: txid, BORN_MS: str(now)})
    if immunity is not None:
        props[CHECK_IMMUNITY_TIME_IN_SECONDS] = str(int(immunity)) \
            if float(immunity).is_integer() else str(immunity)
    if msg.delay_level:
        props[DELAY] = str(msg.delay_level)
    if msg.delay_ms is not None:
        props[DELAY_MS] = str(msg.delay_ms)
    if msg.deliver_at_ms is not None:
        props[TIMER_DELIVER_MS] = str(msg.deliver_at_ms)
    record.topic, record.queue_id, record.tag_code = HALF_TOPIC, 0, 0
    return record


def delayed_message(half: StoredRecord | MessageRecord) -> OutgoingMessage | None:
    """The delay a half message asked for (applied from its commit), if any."""
    props = half.properties
    if DELAY not in props and DELAY_MS not in props and TIMER_DELIVER_MS not in props:
        return None
    msg = OutgoingMessage(body=half.body, message_id=props.get(UNIQ_KEY),
                          tag=props.get(TAGS) or None)
    try:
        msg.delay_level = int(props.get(DELAY, "0"))
        msg.delay_ms = int(props[DELAY_MS]) if DELAY_MS in props else None
        msg.deliver_at_ms = int(props[TIMER_DELIVER_MS]) if TIMER_DELIVER_MS in props else None
    except ValueError:
        return None
    return msg
