"""tidemq: async Python SDK for the tidemq message queue.

    from tidemq import Producer, PushConsumer, SimpleConsumer, ConsumeResult, Message

The modules starting with ``_`` are private; everything public is re-exported here. The shared
wire protocol (error codes, message parsing, topic names) lives in ``tidemq.protocol``.
"""

from __future__ import annotations

from tidemq._allocate import allocate_averagely, allocation_table
from tidemq._auth import Credentials
from tidemq._cancel import CancelResult, CancelState
from tidemq._exceptions import (
    AlreadyDeliveredError,
    AmbiguousMessageIdError,
    BadRequestError,
    BrokerBusyError,
    BrokerNotFoundError,
    ClientClosedError,
    ConfigurationError,
    DiskFullError,
    ForbiddenError,
    ForbiddenSystemTopicError,
    InternalServerError,
    InvalidBodyEncodingError,
    InvalidDelayError,
    InvalidReceiptHandleError,
    InvalidTopicNameError,
    LocalTransactionError,
    LocalTransactionFailed,
    MessageNotFoundError,
    MessageTooLargeError,
    NotEnoughReplicasError,
    NotPrimaryError,
    OffsetOutOfRangeError,
    QueuesNotEmptyError,
    RequestTimeoutError,
    ServerError,
    TidemqError,
    TopicNotFoundError,
    TransactionAlreadyEndedError,
    TransactionNotFoundError,
    TransactionsDisabledError,
    TransportError,
    UnauthorizedError,
    UnavailableError,
    UnexpectedResponseError,
    UnsupportedMediaTypeError,
    UriTooLongError,
    error_class,
    server_error,
)
from tidemq._http import RetryPolicy, use_ca_bundle
from tidemq._message import Message, SendResult, new_message_id
from tidemq._offsets import OffsetTracker
from tidemq._producer import Producer
from tidemq._puller import ConsumeResult, Handler
from tidemq._push_consumer import PushConsumer
from tidemq._routes import MessageQueue
from tidemq._simple_consumer import SimpleConsumer
from tidemq._tags import TagExpression
from tidemq._transaction import TransactionListener, TransactionProducer
from tidemq._transaction_types import TransactionSendResult, TransactionState
from tidemq._transport import HttpTransport, MockTransport, TransportRequest, TransportResponse
from tidemq._typed import BodyDecodeError, Router
from tidemq.protocol import ErrorCode, ReceivedMessage

__all__ = [
    "AlreadyDeliveredError",
    "AmbiguousMessageIdError",
    "BadRequestError",
    "BodyDecodeError",
    "BrokerBusyError",
    "BrokerNotFoundError",
    "CancelResult",
    "CancelState",
    "ClientClosedError",
    "ConfigurationError",
    "ConsumeResult",
    "Credentials",
    "DiskFullError",
    "ErrorCode",
    "ForbiddenError",
    "ForbiddenSystemTopicError",
    "Handler",
    "HttpTransport",
    "InternalServerError",
    "InvalidBodyEncodingError",
    "InvalidDelayError",
    "InvalidReceiptHandleError",
    "InvalidTopicNameError",
    "LocalTransactionError",
    "LocalTransactionFailed",
    "Message",
    "MessageNotFoundError",
    "MessageQueue",
    "MessageTooLargeError",
    "MockTransport",
    "NotEnoughReplicasError",
    "NotPrimaryError",
    "OffsetOutOfRangeError",
    "OffsetTracker",
    "Producer",
    "PushConsumer",
    "QueuesNotEmptyError",
    "ReceivedMessage",
    "RequestTimeoutError",
    "RetryPolicy",
    "Router",
    "SendResult",
    "ServerError",
    "SimpleConsumer",
    "TagExpression",
    "TidemqError",
    "TopicNotFoundError",
    "TransactionAlreadyEndedError",
    "TransactionListener",
    "TransactionNotFoundError",
    "TransactionProducer",
    "TransactionSendResult",
    "TransactionState",
    "TransactionsDisabledError",
    "TransportError",
    "TransportRequest",
    "TransportResponse",
    "UnauthorizedError",
    "UnavailableError",
    "UnexpectedResponseError",
    "UnsupportedMediaTypeError",
    "UriTooLongError",
    "allocate_averagely",
    "allocation_table",
    "error_class",
    "new_message_id",
    "server_error",
    "use_ca_bundle",
]

__version__ = "0.1.0"
