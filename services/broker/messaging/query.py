"""Message queries: by id (with its state), by key, by topic and time range.

``MessageState`` names every state a message can be in; ``message_state`` is the rule for a
plain message (every copy a stored message). The rules for delayed and transactional messages
are views (``MessageView``) in ``tidemq_server.broker.states``, the one place the other rules
live; the composition root hands them to ``QueryService``.

Copies a consumer group sent back (retry topic, DLQ, or waiting out a retry back-off; they carry
``RETRY_TOPIC``) never stand for the message: a lookup by id shows the original and lists those
copies per group in ``retry_history``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any

from tidemq.protocol import ErrorCode, ProtocolError
from tidemq.protocol.properties import REAL_TOPIC, RETRY_TOPIC, TIMER_DELIVER_MS
from tidemq.protocol.topics import DLQ_PREFIX, RETRY_PREFIX

from tidemq_server.broker.messaging.topics import TopicManager
from tidemq_server.broker.store.store import MessageStore
from tidemq_server.broker.store.types import StoredRecord

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


def is_retry_copy(record: StoredRecord) -> bool:
    """A copy a consumer group sent back: in its retry topic or DLQ, or waiting out a back-off."""
    return RETRY_TOPIC in record.properties


def retry_history(copies: list[StoredRecord]) -> list[dict[str, Any]]:
    """Where the retry copies of a message went, one entry per consumer group (by group):
    ``{group, reconsume_times, dead_lettered, copies: [{topic, reconsume_times, state, ...}]}``.

    A copy waiting out its back-off is ``scheduled`` (with ``deliver_at_ms``) until its delivered
    copy (same destination and count) replaces it as ``stored`` (with queue and offset).
    """
    groups: dict[str, dict[str, Any]] = {}
    latest: dict[tuple[str, int], dict[str, Any]] = {}  # (destination, count) → newest copy
    for rec in copies:  # oldest first
        if not is_retry_copy(rec):
            continue
        waiting = not rec.topic.startswith((RETRY_PREFIX, DLQ_PREFIX))
        destination = rec.properties.get(REAL_TOPIC, rec.topic) if waiting else rec.topic
        group = _group_of(destination)
        if group is None:
            continue
        copy: dict[str, Any] = {"topic": destination, "reconsume_times": rec.reconsume_times,
                                "store_timestamp_ms": rec.store_timestamp}
        if waiting:
            copy["state"] = MessageState.SCHEDULED.value
            due = rec.properties.get(TIMER_DELIVER_MS)
            if due is not None and due.isdigit():
                copy["deliver_at_ms"] = int(due)
        else:
            copy.update(state=MessageState.STORED.value, queue_id=rec.queue_id,
                        queue_offset=rec.queue_offset)
        latest[(destination, rec.reconsume_times)] = copy
        entry = groups.setdefault(group, {"group": group, "reconsume_times": 0,
                                          "dead_lettered": False, "copies": []})
        entry["reconsume_times"] = max(entry["reconsume_times"], rec.reconsume_times)
        entry["dead_lettered"] |= destination.startswith(DLQ_PREFIX)
    for (destination, _), copy in latest.items():
        groups[_group_of(destination) or ""]["copies"].append(copy)
    return [groups[g] for g in sorted(groups)]


def _group_of(topic: str) -> str | None:
    for prefix in (RETRY_PREFIX, DLQ_PREFIX):
        if topic.startswith(prefix):
            return topic[len(prefix):]
    return None


class QueryService:
    def __init__(self, store: MessageStore, topics: TopicManager,
                 views: Sequence[MessageView] = ()) -> None:
        self.store = store
        self.topics = topics
        self.views = tuple(views)  # asked in order before message_state (delays, transactions)

    def by_id(self, message_id: str) -> tuple[StoredRecord, MessageState]:
        """The copy standing for the message (the original, not a retry copy) and its state."""
        return self.copies_state(self.copies(message_id))

    def copies(self, message_id: str) -> list[StoredRecord]:
        """Every stored copy of a message, oldest first; 404 MESSAGE_NOT_FOUND when none."""
        copies = self.store.find_by_unique_key(message_id) if message_id else []
        if not copies:
            raise ProtocolError(ErrorCode.MESSAGE_NOT_FOUND,
                                f"no message with message_id {message_id!r} is stored on this "
                                "broker (it may have expired or live on another broker)")
        return copies

    def copies_state(self, copies: list[StoredRecord]) -> tuple[StoredRecord, MessageState]:
        # Retry copies only stand for the message when the original is gone (retention).
        own = [c for c in copies if not is_retry_copy(c)] or copies
        for view in self.views:
            shown = view(own)
            if shown is not None:
                return shown
        return message_state(own)

    def state_of(self, record: StoredRecord) -> MessageState:
        """The state of the message a found record is a copy of (key and time queries)."""
        copies = self.store.find_by_unique_key(record.message_id) if record.message_id else []
        return self.copies_state(copies or [record])[1]

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
