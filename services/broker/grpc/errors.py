"""One table: tidemq's API error codes → ``apache.rocketmq.v2.Code``, and the status of a failure.

Every RPC answers a refused request with a ``Status`` in its response (the RocketMQ convention),
never with a bare gRPC error, so the official clients map it onto their own exception classes
(BadRequest, NotFound, TooManyRequests, ...). Unexpected exceptions are logged and answered as
``INTERNAL_SERVER_ERROR`` naming the exception type.
"""

from __future__ import annotations

import logging
from typing import Any

from tidemq.protocol import ErrorCode, ProtocolError

from tidemq_server.broker.grpc.proto import Code, status

log = logging.getLogger(__name__)

#: tidemq error code → RocketMQ code (codes the clients treat alike are grouped as they are).
ERROR_CODES: dict[ErrorCode, int] = {
    ErrorCode.BAD_REQUEST: Code.BAD_REQUEST,
    ErrorCode.INVALID_TOPIC_NAME: Code.ILLEGAL_TOPIC,
    ErrorCode.INVALID_DELAY: Code.ILLEGAL_DELIVERY_TIME,
    ErrorCode.INVALID_BODY_ENCODING: Code.MESSAGE_CORRUPTED,
    ErrorCode.OFFSET_OUT_OF_RANGE: Code.BAD_REQUEST,
    ErrorCode.INVALID_RECEIPT_HANDLE: Code.INVALID_RECEIPT_HANDLE,
    ErrorCode.UNAUTHORIZED: Code.UNAUTHORIZED,
    ErrorCode.FORBIDDEN_SYSTEM_TOPIC: Code.FORBIDDEN,
    ErrorCode.TRANSACTIONS_DISABLED: Code.FORBIDDEN,
    ErrorCode.TOPIC_NOT_FOUND: Code.TOPIC_NOT_FOUND,
    ErrorCode.MESSAGE_NOT_FOUND: Code.NOT_FOUND,
    ErrorCode.TRANSACTION_NOT_FOUND: Code.INVALID_TRANSACTION_ID,
    ErrorCode.BROKER_NOT_FOUND: Code.NOT_FOUND,
    ErrorCode.TRANSACTION_ALREADY_ENDED: Code.BAD_REQUEST,
    ErrorCode.ALREADY_DELIVERED: Code.BAD_REQUEST,
    ErrorCode.AMBIGUOUS_MESSAGE_ID: Code.BAD_REQUEST,
    ErrorCode.MESSAGE_TOO_LARGE: Code.PAYLOAD_TOO_LARGE,
    ErrorCode.BROKER_BUSY: Code.TOO_MANY_REQUESTS,
    ErrorCode.DISK_FULL: Code.INTERNAL_SERVER_ERROR,
    ErrorCode.UNAVAILABLE: Code.INTERNAL_SERVER_ERROR,
    ErrorCode.INTERNAL_ERROR: Code.INTERNAL_SERVER_ERROR,
}


class RpcRefused(Exception):
    """A request refused with a RocketMQ code that has no tidemq counterpart (e.g. SQL filters)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def error_status(exc: BaseException, rpc: str) -> Any:
    """The ``Status`` answering ``exc`` raised while serving ``rpc``."""
    if isinstance(exc, RpcRefused):
        return status(exc.code, exc.message)
    if isinstance(exc, ProtocolError):
        return status(ERROR_CODES.get(exc.code, Code.INTERNAL_SERVER_ERROR),
                      f"{exc.code.value}: {exc.message}")
    log.exception("gRPC %s failed: %s", rpc, exc)
    return status(Code.INTERNAL_SERVER_ERROR, f"internal error: {type(exc).__name__}")
