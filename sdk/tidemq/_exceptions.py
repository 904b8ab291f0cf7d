"""Every exception the SDK raises, in one hierarchy.

    TidemqError                       root: catch this to catch everything from tidemq
    ├── ConfigurationError            bad arguments to a client (also a ValueError)
    ├── LocalTransactionError         TransactionProducer.send: the local transaction raised
    ├── ClientClosedError             the client was used after close()
    ├── UnexpectedResponseError       the server answered something the protocol does not allow
    ├── TransportError                no answer: connect, read or write failed (retriable)
    │   └── RequestTimeoutError       no answer in time (retriable)
    └── ServerError                   the server answered {code, message} with an error status
        ├── BadRequestError               400 BAD_REQUEST
        ├── InvalidTopicNameError         400 INVALID_TOPIC_NAME
        ├── InvalidDelayError             400 INVALID_DELAY
        ├── InvalidBodyEncodingError      400 INVALID_BODY_ENCODING
        ├── OffsetOutOfRangeError         400 OFFSET_OUT_OF_RANGE
        ├── InvalidReceiptHandleError     400 INVALID_RECEIPT_HANDLE
        ├── UnauthorizedError             401 UNAUTHORIZED
        ├── ForbiddenError                403 FORBIDDEN
        ├── ForbiddenSystemTopicError     403 FORBIDDEN_SYSTEM_TOPIC
        ├── TransactionsDisabledError     403 TRANSACTIONS_DISABLED
        ├── TopicNotFoundError            404 TOPIC_NOT_FOUND
        ├── MessageNotFoundError          404 MESSAGE_NOT_FOUND
        ├── TransactionNotFoundError      404 TRANSACTION_NOT_FOUND
        ├── BrokerNotFoundError           404 BROKER_NOT_FOUND
        ├── TransactionAlreadyEndedError  409 TRANSACTION_ALREADY_ENDED
        ├── AlreadyDeliveredError         409 ALREADY_DELIVERED
        ├── AmbiguousMessageIdError       409 AMBIGUOUS_MESSAGE_ID
        ├── QueuesNotEmptyError           409 QUEUES_NOT_EMPTY
        ├── MessageTooLargeError          413 MESSAGE_TOO_LARGE
        ├── UriTooLongError               414 URI_TOO_LONG
        ├── UnsupportedMediaTypeError     415 UNSUPPORTED_MEDIA_TYPE
        ├── InternalServerError           500 INTERNAL_ERROR (retriable)
        ├── BrokerBusyError               503 BROKER_BUSY (retriable, honours Retry-After)
        ├── DiskFullError                 503 DISK_FULL (retriable: space may come back)
        ├── UnavailableError              503 UNAVAILABLE (retriable)
        ├── NotPrimaryError               503 NOT_PRIMARY (retriable: at the group's primary)
        └── NotEnoughReplicasError        503 NOT_ENOUGH_REPLICAS (retriable)

Every class has ``retriable``: whether sending the same request again may succeed. For a
``ServerError`` subclass it is taken from ``ErrorCode.retriable`` of the shared protocol, so the
SDK and the services cannot disagree. A code this SDK does not know yet is raised as a plain
``ServerError`` whose ``retriable`` follows the HTTP status (502/503/504).

Beside the tree:

    LocalTransactionFailed            the application raises it from execute_local_transaction
    WireError                         the transport's own (sent, the answer lost); never reaches
    ├── WireConnectError              users: the client raises TransportError from it
    WireTimeout (a TimeoutError)      ... and RequestTimeoutError from this one

Foreign exceptions (httpx, msgpack, orjson) never escape: they are translated at the boundary in
``_http.py`` with ``raise ... from exc``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from tidemq.protocol import ErrorCode

if TYPE_CHECKING:
    from tidemq._transaction_types import TransactionSendResult

_RETRIABLE_STATUSES = frozenset({502, 503, 504})


class TidemqError(Exception):
    """Root of every exception raised by the tidemq SDK.

    ``attempts`` and ``elapsed_s``: when the SDK retried the call before giving up, how many
    attempts it made and over how long (the message says it too); 1 and 0.0 otherwise.
    """

    retriable: bool = False
    attempts: int = 1
    elapsed_s: float = 0.0


class ConfigurationError(TidemqError, ValueError):
    """A client was built or called with arguments that cannot work."""


class ClientClosedError(TidemqError):
    """The client was used after ``close()``."""


class LocalTransactionError(TidemqError):
    """``TransactionProducer.send``: ``execute_local_transaction`` raised, and the transaction
    was ended because of it — with ROLLBACK when the listener raised ``LocalTransactionFailed``
    (the message is never delivered), with UNKNOWN for any other exception (the broker checks
    the group later, and the answer decides).

    ``__cause__`` is the exception the local transaction raised; ``result`` is the send's
    ``TransactionSendResult`` (``local_state`` says how the transaction was ended,
    ``end_error`` whether that end reached the broker).
    """

    def __init__(self, result: TransactionSendResult) -> None:
        cause = result.error
        outcome = ("rolled back: the message will never be delivered"
                   if result.local_state.value == "rollback"
                   else "ended as UNKNOWN: the broker will check it")
        super().__init__(f"local transaction of message {result.message_id} failed "
                         f"({type(cause).__name__}: {cause}); transaction "
                         f"{result.transaction_id} {outcome}")
        self.result = result


class UnexpectedResponseError(TidemqError):
    """The server's answer does not follow docs/api.md (e.g. a missing field): a server bug."""


class TransportError(TidemqError):
    """The request got no answer: connection refused or reset, DNS, protocol error.

    ``sent`` is False only when no connection could be opened (refused, connect timeout, no
    pooled connection in time): then nothing reached the server. When True the server may have
    received the request and acted on it (a send may be stored) without the answer arriving.
    """

    retriable = True

    def __init__(self, message: str, *, sent: bool = True) -> None:
        super().__init__(message)
        self.sent = sent


class RequestTimeoutError(TransportError):
    """The request got no complete answer within its timeout."""


class ServerError(TidemqError):
    """The server refused the request with ``{"code", "message"}`` and an error status.

    ``code`` is the API code (an ``ErrorCode`` when this SDK knows it, else the raw string),
    ``status`` the HTTP status and ``retry_after`` the server's ``Retry-After`` in seconds.
    """

    error_code: ClassVar[ErrorCode | None] = None

    def __init__(
        self,
        code: ErrorCode | str,
        message: str,
        status: int,
        retry_after: float | None = None,
        *,
        retriable: bool | None = None,
    ) -> None:
        super().__init__(f"{code}: {message} (HTTP {status})")
        self.code = code
        self.message = message
        self.status = status
        self.retry_after = retry_after
        if retriable is not None:
            self.retriable = retriable

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.error_code is not None:
            cls.retriable = cls.error_code.retriable


class BadRequestError(ServerError):
    error_code = ErrorCode.BAD_REQUEST


class InvalidTopicNameError(ServerError):
    error_code = ErrorCode.INVALID_TOPIC_NAME


class InvalidDelayError(ServerError):
    error_code = ErrorCode.INVALID_DELAY


class InvalidBodyEncodingError(ServerError):
    error_code = ErrorCode.INVALID_BODY_ENCODING


class OffsetOutOfRangeError(ServerError):
    error_code = ErrorCode.OFFSET_OUT_OF_RANGE


class InvalidReceiptHandleError(ServerError):
    error_code = ErrorCode.INVALID_RECEIPT_HANDLE


class UnauthorizedError(ServerError):
    error_code = ErrorCode.UNAUTHORIZED


class ForbiddenError(ServerError):
    """Signed, but the ACL rules do not allow this action on this resource (named in the
    message)."""

    error_code = ErrorCode.FORBIDDEN


class ForbiddenSystemTopicError(ServerError):
    error_code = ErrorCode.FORBIDDEN_SYSTEM_TOPIC


class TransactionsDisabledError(ServerError):
    error_code = ErrorCode.TRANSACTIONS_DISABLED


class TopicNotFoundError(ServerError):
    error_code = ErrorCode.TOPIC_NOT_FOUND


class MessageNotFoundError(ServerError):
    error_code = ErrorCode.MESSAGE_NOT_FOUND


class TransactionNotFoundError(ServerError):
    error_code = ErrorCode.TRANSACTION_NOT_FOUND


class BrokerNotFoundError(ServerError):
    error_code = ErrorCode.BROKER_NOT_FOUND


class TransactionAlreadyEndedError(ServerError):
    error_code = ErrorCode.TRANSACTION_ALREADY_ENDED


class AlreadyDeliveredError(ServerError):
    error_code = ErrorCode.ALREADY_DELIVERED


class AmbiguousMessageIdError(ServerError):
    """A cancel without a topic named an id that is delayed in several topics (listed in the
    message): nothing was cancelled; name the topic."""

    error_code = ErrorCode.AMBIGUOUS_MESSAGE_ID


class QueuesNotEmptyError(ServerError):
    error_code = ErrorCode.QUEUES_NOT_EMPTY


class MessageTooLargeError(ServerError):
    error_code = ErrorCode.MESSAGE_TOO_LARGE


class UriTooLongError(ServerError):
    error_code = ErrorCode.URI_TOO_LONG


class UnsupportedMediaTypeError(ServerError):
    error_code = ErrorCode.UNSUPPORTED_MEDIA_TYPE


class InternalServerError(ServerError):
    error_code = ErrorCode.INTERNAL_ERROR


class BrokerBusyError(ServerError):
    error_code = ErrorCode.BROKER_BUSY


class DiskFullError(ServerError):
    error_code = ErrorCode.DISK_FULL


class UnavailableError(ServerError):
    error_code = ErrorCode.UNAVAILABLE


class NotPrimaryError(ServerError):
    error_code = ErrorCode.NOT_PRIMARY


class NotEnoughReplicasError(ServerError):
    error_code = ErrorCode.NOT_ENOUGH_REPLICAS


_BY_CODE: dict[ErrorCode, type[ServerError]] = {
    cls.error_code: cls
    for cls in ServerError.__subclasses__()
    if cls.error_code is not None
}


def error_class(code: ErrorCode | str) -> type[ServerError]:
    """The exception class for an API code; ``ServerError`` itself for an unknown code."""
    try:
        return _BY_CODE[ErrorCode(code)]
    except ValueError:
        return ServerError


def server_error(
    code: ErrorCode | str, message: str, status: int | None = None,
    retry_after: float | None = None,
) -> ServerError:
    """Build the exception for ``{code, message}``; ``status`` defaults to the code's own."""
    try:
        known: ErrorCode | None = ErrorCode(code)
    except ValueError:
        known = None
    if known is not None:
        return _BY_CODE[known](known, message, status or known.http_status, retry_after)
    status = status or 500
    return ServerError(code, message, status, retry_after,
                       retriable=status in _RETRIABLE_STATUSES)


class LocalTransactionFailed(Exception):
    """Raise from ``execute_local_transaction`` when the local transaction failed *and is known
    to be rolled back* (chain the cause: ``raise LocalTransactionFailed(...) from exc``): the
    producer ends it with ROLLBACK at once, then ``send`` raises ``LocalTransactionError`` from
    the cause. Any other exception means UNKNOWN (the broker checks)."""


# --- the transport's own (``_transport``, ``_wire``): translated to TransportError ------------

class WireError(Exception):
    """The request failed after it was (maybe) sent: the server may have processed it."""

    sent = True


class WireConnectError(WireError):
    """No connection could be opened: nothing was sent."""

    sent = False


class WireTimeout(TimeoutError):
    """The caller's deadline passed; ``sent`` says whether the request had gone out."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent
