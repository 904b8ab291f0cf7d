"""Error codes of the public API (docs/api.md), each with its HTTP status and whether a retry may
help.

One table maps code → status; services answer ``{"code", "message"}`` with that status and the
SDK maps the code back to an exception class.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    BAD_REQUEST = "BAD_REQUEST"  # malformed body or field
    INVALID_TOPIC_NAME = "INVALID_TOPIC_NAME"  # topic or group name fails the name rule
    INVALID_DELAY = "INVALID_DELAY"  # delay_level / delay_ms / deliver_at_ms out of range
    INVALID_BODY_ENCODING = "INVALID_BODY_ENCODING"  # body_encoding unknown or body undecodable
    OFFSET_OUT_OF_RANGE = "OFFSET_OUT_OF_RANGE"  # pull above max_offset
    INVALID_RECEIPT_HANDLE = "INVALID_RECEIPT_HANDLE"  # unknown, expired or malformed handle
    UNAUTHORIZED = "UNAUTHORIZED"  # no valid credentials (internal token, or a signature)
    FORBIDDEN = "FORBIDDEN"  # signed, but the ACL rules do not allow this action on this resource
    FORBIDDEN_SYSTEM_TOPIC = "FORBIDDEN_SYSTEM_TOPIC"  # write to a system topic on the public API
    TRANSACTIONS_DISABLED = "TRANSACTIONS_DISABLED"  # broker rejects transactional messages
    TOPIC_NOT_FOUND = "TOPIC_NOT_FOUND"
    MESSAGE_NOT_FOUND = "MESSAGE_NOT_FOUND"
    TRANSACTION_NOT_FOUND = "TRANSACTION_NOT_FOUND"
    BROKER_NOT_FOUND = "BROKER_NOT_FOUND"  # nameserver: no such broker registered
    TRANSACTION_ALREADY_ENDED = "TRANSACTION_ALREADY_ENDED"  # conflicting end action
    ALREADY_DELIVERED = "ALREADY_DELIVERED"  # cancel after delivery
    AMBIGUOUS_MESSAGE_ID = "AMBIGUOUS_MESSAGE_ID"  # an id delayed in several topics: name one
    QUEUES_NOT_EMPTY = "QUEUES_NOT_EMPTY"  # shrinking a topic would hide stored messages
    MESSAGE_TOO_LARGE = "MESSAGE_TOO_LARGE"  # body, properties or batch over its limit
    UNSUPPORTED_MEDIA_TYPE = "UNSUPPORTED_MEDIA_TYPE"  # body neither JSON nor msgpack
    URI_TOO_LONG = "URI_TOO_LONG"  # a request target (path and query) over the servers' limit
    BROKER_BUSY = "BROKER_BUSY"  # flow control; retry after Retry-After
    DISK_FULL = "DISK_FULL"  # store refuses writes; nothing deletable
    UNAVAILABLE = "UNAVAILABLE"  # dependency down or service shutting down
    NOT_PRIMARY = "NOT_PRIMARY"  # a replica (or deposed primary) was asked to write
    NOT_ENOUGH_REPLICAS = "NOT_ENOUGH_REPLICAS"  # fewer in-sync copies than min_insync
    INTERNAL_ERROR = "INTERNAL_ERROR"  # a bug: the server logged it

    @property
    def http_status(self) -> int:
        return _STATUS[self]

    @property
    def retriable(self) -> bool:
        return self in _RETRIABLE


_STATUS: dict[ErrorCode, int] = {
    ErrorCode.BAD_REQUEST: 400,
    ErrorCode.INVALID_TOPIC_NAME: 400,
    ErrorCode.INVALID_DELAY: 400,
    ErrorCode.INVALID_BODY_ENCODING: 400,
    ErrorCode.OFFSET_OUT_OF_RANGE: 400,
    ErrorCode.INVALID_RECEIPT_HANDLE: 400,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.FORBIDDEN_SYSTEM_TOPIC: 403,
    ErrorCode.TRANSACTIONS_DISABLED: 403,
    ErrorCode.TOPIC_NOT_FOUND: 404,
    ErrorCode.MESSAGE_NOT_FOUND: 404,
    ErrorCode.TRANSACTION_NOT_FOUND: 404,
    ErrorCode.BROKER_NOT_FOUND: 404,
    ErrorCode.TRANSACTION_ALREADY_ENDED: 409,
    ErrorCode.ALREADY_DELIVERED: 409,
    ErrorCode.AMBIGUOUS_MESSAGE_ID: 409,
    ErrorCode.QUEUES_NOT_EMPTY: 409,
    ErrorCode.MESSAGE_TOO_LARGE: 413,
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: 415,
    ErrorCode.URI_TOO_LONG: 414,
    ErrorCode.BROKER_BUSY: 503,
    ErrorCode.DISK_FULL: 503,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.NOT_PRIMARY: 503,
    ErrorCode.NOT_ENOUGH_REPLICAS: 503,
    ErrorCode.INTERNAL_ERROR: 500,
}

# DISK_FULL is retriable (Kafka's KafkaStorageException is too): space comes back when retention
# or an operator frees it, a retry keeps the message id, and a call that cannot move to another
# group (a cancel, a pinned send) would otherwise fail during a transient full disk
_RETRIABLE = frozenset({ErrorCode.BROKER_BUSY, ErrorCode.UNAVAILABLE, ErrorCode.INTERNAL_ERROR,
                        ErrorCode.NOT_PRIMARY, ErrorCode.NOT_ENOUGH_REPLICAS,
                        ErrorCode.DISK_FULL})


class ProtocolError(Exception):
    """A request the server refuses: carries the API code and a message naming what is wrong."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message

    def to_wire(self) -> dict[str, str]:
        return {"code": self.code.value, "message": self.message}
