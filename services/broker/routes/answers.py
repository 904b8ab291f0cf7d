"""What the broker's public endpoints answer (docs/api.md), as models for the OpenAPI document.

Documentation only: routes build their answers as plain dicts (the hot paths stay free of
pydantic) and pass them to ``reply``; these models are their ``response_model``. In msgpack
answers a message ``body`` is raw bytes and ``body_encoding`` is absent.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from tidemq_server.broker.messaging.query import MessageState
from tidemq_server.broker.transactions.model import TxState
from tidemq_server.common.answers import Perm

BodyEncoding = Literal["utf-8", "base64"]


class TopicAnswer(BaseModel):
    name: str
    queues: int
    perm: Perm


class TopicList(BaseModel):
    topics: list[TopicAnswer]


class QueueOffsetsOut(BaseModel):
    queue_id: int
    min: int = Field(description="first offset still stored")
    max: int = Field(description="offset the next message will get")
    at: int | None = Field(None, description="with at_ms: first offset stored at or after it")


class TopicDetail(TopicAnswer):
    offsets: list[QueueOffsetsOut]


class SentMessage(BaseModel):
    message_id: str
    queue_id: int = Field(description="a delayed message: the queue it will be delivered to")
    queue_offset: int | None = Field(description="null for a delayed message: it has no "
                                                 "position until it is delivered")
    state: MessageState | None = Field(None, description='delayed messages only: "scheduled"; '
                                       'a repeated send also "cancelled" or "stored"')
    deliver_at_ms: int | None = Field(None, description="delayed messages only: the due time")


class SendAnswer(BaseModel):
    results: list[SentMessage] = Field(description="in request order")


class Position(BaseModel):
    """Where a message is stored."""

    message_id: str
    topic: str
    queue_id: int
    queue_offset: int


class MessageBase(Position):
    """A message's position and body, as every answer that returns messages gives them."""

    body: str = Field(description="utf-8 text or base64 text (JSON); raw bytes (msgpack)")
    body_encoding: BodyEncoding | None = Field(None, description="JSON answers only")


class QueueBounds(BaseModel):
    """Where a page read from one consume queue ends, and the queue's bounds."""

    next_offset: int = Field(description="queue offset to read from next")
    min_offset: int = Field(description="first offset still stored")
    max_offset: int = Field(description="offset the next record will get")


class MessageOut(MessageBase):
    """A returned message (docs/api.md "Returned messages")."""

    tag: str | None
    keys: list[str]
    properties: dict[str, str]
    born_timestamp_ms: int
    store_timestamp_ms: int
    reconsume_times: int
    origin_topic: str | None = Field(None, description="retry and DLQ copies: the topic the "
                                                       "message was first consumed from")


class PullAnswer(QueueBounds):
    messages: list[MessageOut]


class ErrorOut(BaseModel):
    code: str = Field(description="the API code this queue's own pull would have answered")
    message: str


class QueuePullAnswer(BaseModel):
    """One queue of a multi-queue pull: its messages and bounds, or its error."""

    topic: str
    queue_id: int
    messages: list[MessageOut] | None = Field(None, description="absent with error")
    next_offset: int | None = Field(None, description="queue offset to read from next")
    min_offset: int | None = None
    max_offset: int | None = None
    error: ErrorOut | None = Field(None, description="this queue could not be read")


class PullManyAnswer(BaseModel):
    queues: list[QueuePullAnswer] = Field(description="the queues with news only (messages, "
                                                      "a moved offset, an error)")


class StoredMessageOut(MessageOut):
    state: MessageState
    # a message waiting for its delivery has no position: the one field a lookup may leave null
    queue_offset: int | None = Field(  # type: ignore[assignment]
        description="null while scheduled or cancelled (no position until delivered)")
    deliver_at_ms: int | None = Field(None, description="scheduled or cancelled: the due time")


class Messages(BaseModel):
    messages: list[MessageOut]


class Members(BaseModel):
    members: list[str] = Field(description="live client ids, sorted")


class CommittedOffset(BaseModel):
    topic: str
    queue_id: int
    offset: int
    max_offset: int
    lag: int


class Offsets(BaseModel):
    offsets: list[CommittedOffset]


class RetryAnswer(BaseModel):
    destination: str = Field(description='"%RETRY%{group}" or "%DLQ%{group}"')


class ReceivedMessageOut(MessageOut):
    receipt_handle: str


class ReceiveAnswer(BaseModel):
    messages: list[ReceivedMessageOut]


class AckAnswer(BaseModel):
    acked: int


class HandleAnswer(BaseModel):
    receipt_handle: str = Field(description="the new handle")


class Transaction(BaseModel):
    transaction_id: str
    message_id: str


class EndResult(BaseModel):
    """One end's outcome: ``state``, or ``code`` and ``message`` when it was refused."""

    transaction_id: str
    state: TxState | None = None
    code: str | None = None
    message: str | None = None


class BeginAnswer(BaseModel):
    """``message`` given: ``transaction_id`` and ``message_id``; ``messages`` given:
    ``transactions``. ``results`` answers the ``ends`` that rode along."""

    transaction_id: str | None = None
    message_id: str | None = None
    transactions: list[Transaction] | None = None
    results: list[EndResult] | None = None


class EndState(BaseModel):
    state: TxState


class EndResults(BaseModel):
    results: list[EndResult]


class PendingTransaction(BaseModel):
    transaction_id: str
    message_id: str
    topic: str
    producer_group: str
    check_times: int
    born_timestamp_ms: int
    state: TxState


class PendingTransactions(BaseModel):
    transactions: list[PendingTransaction]


class Check(BaseModel):
    transaction_id: str
    message_id: str
    topic: str
    check_times: int = Field(description="this check included (1 on the first)")
    message: MessageOut


class Checks(BaseModel):
    checks: list[Check]


class Cancelled(BaseModel):
    message_id: str
    state: Literal["cancelled"]


class DeletedTopic(BaseModel):
    deleted: str = Field(description="the topic's name")
    queues: int


class GroupInfo(BaseModel):
    group: str
    members: list[str]
    mode: str | None = Field(description='"clustering" or "broadcasting"; null without live '
                                         "members")
    subscriptions: dict[str, str] = Field(description='topic → "*" or "tagA || tagB"')
    topics: list[str] = Field(description="subscribed or with committed offsets")


class Groups(BaseModel):
    groups: list[GroupInfo]
