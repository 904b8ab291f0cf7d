"""What the store's copies of one message id say about its delays, topic by topic.

Message ids are unique per topic only: one id may wait as a delayed message in topics A and B
at once. A cancel is about one (topic, id), so the copies are read per real topic:

- a waiting copy (``SCHEDULE_TOPIC_XXXX`` / the timer intake) belongs to its ``REAL_TOPIC``;
- a cancel record (``TIDE_SYS_TIMER_CANCELS``) to its ``REAL_TOPIC`` — one written before
  cancels named a topic (no ``REAL_TOPIC``) to every topic waiting at that point;
- a delivered (or plain) copy to its own topic. Retry, dead-letter, transaction and other system
  copies decide nothing here.

The newest of these per topic is that topic's standing: ``PENDING`` (waiting), ``CANCELLED``,
or ``DELIVERED`` (a delayed message delivered) / ``PLAIN`` (stored without a delay).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from tidemq.protocol import REAL_TOPIC, ErrorCode, ProtocolError, is_system_topic

from tidemq_server.broker.delays.routing import CANCELS_TOPIC, is_waiting
from tidemq_server.broker.store.types import StoredRecord
from tidemq_server.common.cancels import ambiguous_id


class Standing(StrEnum):
    PENDING = "pending"  # its newest copy waits for its due time
    CANCELLED = "cancelled"  # cancelled before delivery
    DELIVERED = "delivered"  # delayed, then delivered
    PLAIN = "plain"  # stored at once (sent without a delay): nothing to cancel


@dataclass(frozen=True, slots=True)
class TopicCopies:
    """One topic's copies of the id: its standing and the copy that says so."""

    topic: str
    standing: Standing
    newest: StoredRecord  # the waiting copy, cancel record or delivered copy deciding it


def by_topic(copies: list[StoredRecord]) -> dict[str, TopicCopies]:
    """The standing of the id in each topic it was sent to (``copies`` oldest first)."""
    newest: dict[str, StoredRecord] = {}
    delayed: set[str] = set()  # topics where the id waited at some point
    for rec in copies:
        if is_waiting(rec):
            topic = rec.properties[REAL_TOPIC]
            newest[topic] = rec
            delayed.add(topic)
        elif rec.topic == CANCELS_TOPIC:
            named = rec.properties.get(REAL_TOPIC)
            for topic in [named] if named else [t for t, r in newest.items() if is_waiting(r)]:
                newest[topic] = rec
                delayed.add(topic)
        elif not is_system_topic(rec.topic):
            newest[rec.topic] = rec
    out: dict[str, TopicCopies] = {}
    for topic, rec in newest.items():
        if is_waiting(rec):
            standing = Standing.PENDING
        elif rec.topic == CANCELS_TOPIC:
            standing = Standing.CANCELLED
        else:
            standing = Standing.DELIVERED if topic in delayed else Standing.PLAIN
        out[topic] = TopicCopies(topic, standing, rec)
    return out


def choose(message_id: str, topics: dict[str, TopicCopies], topic: str | None
           ) -> TopicCopies | None:
    """The topic a cancel is about: ``topic`` when given (None when the store holds no copy of
    the id there: the scheduler is asked), else the only topic where the id is pending — or,
    when it is pending nowhere, the only topic where it was delayed. Raises 409
    AMBIGUOUS_MESSAGE_ID when several topics qualify and 404 MESSAGE_NOT_FOUND for an id
    stored only without a delay; None when the store knows nothing of it."""
    if topic is not None:
        return topics.get(topic)
    pending = [t for t in topics.values() if t.standing is Standing.PENDING]
    if len(pending) == 1:
        return pending[0]
    delayed = pending or [t for t in topics.values() if t.standing is not Standing.PLAIN]
    if len(delayed) > 1:
        raise ambiguous_id(message_id, (t.topic for t in delayed))
    if delayed:
        return delayed[0]
    if topics:
        plain = sorted(topics)
        raise ProtocolError(ErrorCode.MESSAGE_NOT_FOUND,
                            f"message {message_id!r} was never delayed (stored at once in "
                            f"{', '.join(repr(t) for t in plain)}: sent without a delay, or "
                            "with one of 0 or in the past): no delayed message to cancel")
    return None


def settled(message_id: str, mine: TopicCopies) -> None:
    """Raise what a cancel answers when the store alone decides: the message was delivered or
    never delayed; returns when it is pending or cancelled."""
    if mine.standing is Standing.DELIVERED:
        raise delivered(message_id, mine.topic)
    if mine.standing is Standing.PLAIN:
        raise ProtocolError(ErrorCode.MESSAGE_NOT_FOUND,
                            f"message {message_id!r} was never delayed in {mine.topic!r} "
                            "(stored at once: sent without a delay, or with one of 0 or in the "
                            "past): no delayed message to cancel")


def delivered(message_id: str, topic: str) -> ProtocolError:
    return ProtocolError(ErrorCode.ALREADY_DELIVERED,
                         f"message {message_id!r} was already delivered to {topic!r}: nothing "
                         "to cancel")
