"""What a store write's outcome means to a client: ``PutStatus`` → error code and text.

The appender (store/appender.py) answers expected refusals (busy, disk full, not primary, ...)
as a ``PutStatus`` inside its result, never as an exception; this module is the one table that
turns them into the ``ProtocolError`` a request fails with (``appended_or_raise`` for a write,
``settled_or_raise`` for a settle of records already in the log).
"""

from __future__ import annotations

from tidemq.protocol import ErrorCode, ProtocolError

from tidemq_server.broker.store.types import Appended, PutResult, PutStatus

#: PutStatus → the error a client gets (OK is absent: it is not an error).
PUT_ERRORS: dict[PutStatus, tuple[ErrorCode, str]] = {
    PutStatus.BUSY: (ErrorCode.BROKER_BUSY,
                     "broker busy: the write queue is full; retry after Retry-After seconds"),
    PutStatus.DISK_FULL: (ErrorCode.DISK_FULL,
                          "the broker's disk is full and nothing can be deleted; writes refused"),
    PutStatus.UNAVAILABLE: (ErrorCode.UNAVAILABLE,
                            "the store is closed or unavailable; retry on another broker"),
    # 500, not 503: the batch may be partly on disk, so a client retries here (dedup answers
    # the first result) instead of moving the message to another broker group
    PutStatus.WRITE_FAILED: (ErrorCode.INTERNAL_ERROR,
                             "the store's write failed and the broker stopped writing; part of "
                             "the request may be stored: retry with the same message ids"),
    PutStatus.TOO_LARGE: (ErrorCode.MESSAGE_TOO_LARGE,
                          "a record is larger than a commit log segment can hold"),
    PutStatus.INVALID: (ErrorCode.BAD_REQUEST,
                        "a record field is out of the range the store keeps; nothing was stored"),
    PutStatus.NOT_PRIMARY: (ErrorCode.NOT_PRIMARY,
                            "this broker does not take writes; send to the group's primary"),
    PutStatus.NOT_ENOUGH_REPLICAS: (ErrorCode.NOT_ENOUGH_REPLICAS,
                                    "fewer in-sync copies than min_insync hold the records, so "
                                    "they are not acknowledged; retry later with the same "
                                    "message ids (a record already written is not stored "
                                    "twice)"),
}


def appended_or_raise(result: PutResult) -> list[Appended]:
    """The appended records of a successful put, or the ProtocolError its status maps to."""
    if result.status is PutStatus.OK:
        return result.appended
    code, text = PUT_ERRORS[result.status]
    raise ProtocolError(code, f"{text} ({result.message})" if result.message else text)


def settled_or_raise(status: PutStatus) -> None:
    """Nothing when records already in the log may be acknowledged (``Appender.settle``), else
    the ProtocolError its status maps to."""
    appended_or_raise(PutResult(status))


def write_failed(exc: BaseException) -> ProtocolError:
    """The error the requests waiting on a failed write get (a duplicate in flight)."""
    return exc if isinstance(exc, ProtocolError) else ProtocolError(
        ErrorCode.UNAVAILABLE, f"store write failed: {type(exc).__name__}")
