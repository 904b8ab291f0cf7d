"""The tidemq wire protocol, shared by the SDK and every service.

Pure data and pure functions: error codes and their HTTP statuses, limits, system topic
names, record property names, message parsing and validation, body encodings, the transaction
event schema and the broker ↔ scheduler rows. No I/O lives here.
"""

from __future__ import annotations

from tidemq.protocol.codec import (
    CONTENT_JSON,
    CONTENT_MSGPACK,
    decode_payload,
    encode_payload,
)
from tidemq.protocol.codes import ErrorCode, ProtocolError
from tidemq.protocol.message import (
    CONSUME_FAILURE,
    MAX_CONSUME_FAILURE_CHARS,
    Limits,
    OutgoingMessage,
    ReceivedMessage,
    parse_message,
    parse_messages,
)
from tidemq.protocol.properties import (
    BORN_MS,
    CHECK_IMMUNITY_TIME_IN_SECONDS,
    DELAY,
    DELAY_MS,
    KEYS,
    MAX_RECONSUME_TIMES,
    ORIGIN_MESSAGE_ID,
    PGROUP,
    REAL_QID,
    REAL_TOPIC,
    RECONSUME_TIME,
    RESERVED_PREFIX,
    RESERVED_PROPERTIES,
    RETRY_TOPIC,
    SHARDING_KEY,
    TAGS,
    TIDE_TIMER_ROLLS,
    TIMER_DELIVER_MS,
    TRAN_MSG,
    TRANSACTION_CHECK_TIMES,
    TRANSACTION_ID,
    UNIQ_KEY,
)
from tidemq.protocol.records.events import EVENT_FIELDS, EventKind, EventSource, make_event
from tidemq.protocol.schedule import DELIVERY_FIELDS, DeliveryRow, DueRecord, IntakeRow
from tidemq.protocol.topics import (
    Perm,
    SystemTopic,
    dlq_topic,
    is_system_topic,
    parse_perm,
    retry_topic,
    validate_client_id,
    validate_group_name,
    validate_topic_name,
)

__all__ = [
    "BORN_MS",
    "CHECK_IMMUNITY_TIME_IN_SECONDS",
    "CONSUME_FAILURE",
    "CONTENT_JSON",
    "CONTENT_MSGPACK",
    "DELAY",
    "DELAY_MS",
    "DELIVERY_FIELDS",
    "EVENT_FIELDS",
    "KEYS",
    "MAX_CONSUME_FAILURE_CHARS",
    "MAX_RECONSUME_TIMES",
    "ORIGIN_MESSAGE_ID",
    "PGROUP",
    "REAL_QID",
    "REAL_TOPIC",
    "RECONSUME_TIME",
    "RESERVED_PREFIX",
    "RESERVED_PROPERTIES",
    "RETRY_TOPIC",
    "SHARDING_KEY",
    "TAGS",
    "TIDE_TIMER_ROLLS",
    "TIMER_DELIVER_MS",
    "TRANSACTION_CHECK_TIMES",
    "TRANSACTION_ID",
    "TRAN_MSG",
    "UNIQ_KEY",
    "DeliveryRow",
    "DueRecord",
    "ErrorCode",
    "EventKind",
    "EventSource",
    "IntakeRow",
    "Limits",
    "OutgoingMessage",
    "Perm",
    "ProtocolError",
    "ReceivedMessage",
    "SystemTopic",
    "decode_payload",
    "dlq_topic",
    "encode_payload",
    "is_system_topic",
    "make_event",
    "parse_message",
    "parse_messages",
    "parse_perm",
    "retry_topic",
    "validate_client_id",
    "validate_group_name",
    "validate_topic_name",
]
