"""The tidemq wire protocol, shared by the SDK and every service.

Pure data and pure functions: error codes and their HTTP statuses, limits, system topic
names, message parsing and validation, body encodings. No I/O lives here.
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
    Limits,
    OutgoingMessage,
    ReceivedMessage,
    parse_message,
    parse_messages,
)
from tidemq.protocol.topics import (
    SystemTopic,
    dlq_topic,
    is_system_topic,
    retry_topic,
    validate_group_name,
    validate_topic_name,
)

__all__ = [
    "CONTENT_JSON",
    "CONTENT_MSGPACK",
    "ErrorCode",
    "Limits",
    "OutgoingMessage",
    "ProtocolError",
    "ReceivedMessage",
    "SystemTopic",
    "decode_payload",
    "dlq_topic",
    "encode_payload",
    "is_system_topic",
    "parse_message",
    "parse_messages",
    "retry_topic",
    "validate_group_name",
    "validate_topic_name",
]
