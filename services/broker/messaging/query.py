"""Message queries: by id (with its state), by key, by topic and time range.

``message_state`` is the one place a message's state is computed from its copies; today every
copy is a plain stored message. Transactions and delays extend it with their own states.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

from tidemq.protocol import ErrorCode, ProtocolError

from services.broker.messaging.topics import TopicManager
from services.broker.store.store import MessageStore
from services.broker.store.types import StoredRecord

MAX_QUERY = 1024  # messages per key or time query
DEFAULT_QUERY = 64


class MessageState(StrEnum):
    STORED = "stored"  # a consumable plain message (also a delayed one after delivery)
    HALF = "half"  # transactional, not yet committed (also after "unknown")
    COMMITTED = "committed"  # transactional, committed: consumable
    ROLLED_BACK = "rolled_back"
    DISCARDED = "discarded"  # transactional, checked too often: never delivered
    SCHEDULED = "scheduled"  # delayed, not yet delivered
    CANCELLED = "cancelled"  # delayed, cancelled before delivery


def message_state(copies: list[StoredRecord]) -> tuple[StoredRecord, MessageState]:
    """The copy to show and the message's state, from every copy of it (oldest first)."""
    return copies[-1], MessageState.STORED


#: A feature's view of a message: the copy to show and its state, or None when not its own.
MessageView = Callable[[list[StoredRecord]], "tuple[StoredRecord, MessageState] | None"]


class QueryService:
    def __init__(self, store: MessageStore, topics: TopicManager) -> None:
        self.store = store
        self.topics = topics
        self.views: list[MessageView] = []  # asked in order before message_state (transactions)

    def by_id(self, message_id: str) -> tuple[StoredRecord, MessageState]:
        copies = self.store.find_by_unique_key(message_id) if message_id else []
        if not copies:
            raise ProtocolError(ErrorCode.MESSAGE_NOT_FOUND,
                                f"no message with message_id {message_id!r} is stored on this "
                                "broker (it may have expired or live on another broker)")
        for view in self.views:
            shown = view(copies)
            if shown is not None:
                return shown
        return message_state(copies)

    def by_key(self, topic: str, key: str, begin_ms: int = 0, end_ms: int = 2**62,
               max_count: int = DEFAULT_QUERY) -> list[StoredRecord]:
        self.topics.require(topic)
        if not key:
            raise ProtocolError(ErrorCode.BAD_REQUEST, "key must not be empty")
        found = self.store.find_by_key(topic, key, begin_ms, end_ms, _bounded(max_count))
        return [r for r in found if r.topic == topic and key in r.keys]

    def by_time(self, topic: str, begin_ms: int, end_ms: int,
                max_count: int = DEFAULT_QUERY) -> list[StoredRecord]:
        self.topics.require(topic)
        if end_ms < begin_ms:
            raise ProtocolError(ErrorCode.BAD_REQUEST,
                                f"end_ms {end_ms} is before begin_ms {begin_ms}")
        found = self.store.find_by_time(topic, begin_ms, end_ms, _bounded(max_count))
        return [r for r in found if r.topic == topic]


def _bounded(max_count: int) -> int:
    return max(1, min(max_count, MAX_QUERY))
