"""Delayed delivery on the broker: validate a delay, and store the message where it waits.

- ``delay_level`` n → ``SCHEDULE_TOPIC_XXXX`` queue n-1, with the delivery time (epoch ms) in
  the consume queue's tag slot; the scheduler walks each level queue in order.
- ``delay_ms`` / ``deliver_at_ms`` → the timer intake topic (``TIDE_SYS_TIMER_INTAKE``), which
  the scheduler consumes into its own time-bucketed log on disk.

The waiting copy keeps the message whole (body, identity, tag, keys, properties, flags) and adds
``REAL_TOPIC``, ``REAL_QID``, ``TIMER_DELIVER_MS`` (and ``DELAY`` for a level). A due time in the
past, or a delay of 0, means "deliver at once": the message is stored as it is.

A transaction's half message keeps its delay fields as properties (transactions/requests.py);
its committed copy goes through ``validate`` and ``route`` at commit, so a delay counts from the
commit. Retries route through ``route_record`` (fields given).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tidemq.protocol import (
    DELAY,
    DELAY_MS,
    REAL_QID,
    REAL_TOPIC,
    TIMER_DELIVER_MS,
    ErrorCode,
    OutgoingMessage,
    ProtocolError,
    SystemTopic,
    is_system_topic,
)
from tidemq.protocol.topics import DLQ_PREFIX, RETRY_PREFIX

from tidemq_server.broker.store.types import MessageRecord, StoredRecord

DELAY_LEVEL_TOPIC = SystemTopic.SCHEDULE.value
INTAKE_TOPIC = SystemTopic.TIMER_INTAKE.value
CANCELS_TOPIC = SystemTopic.TIMER_CANCELS.value
DELAY_TOPICS = frozenset({DELAY_LEVEL_TOPIC, INTAKE_TOPIC})

#: What a waiting copy adds to a message (a half message keeps its delay in DELAY, DELAY_MS or
#: TIMER_DELIVER_MS alone); a delivered copy carries none of them.
WAITING_PROPERTIES = (REAL_TOPIC, REAL_QID, DELAY, DELAY_MS, TIMER_DELIVER_MS)


class DelayRouter:
    """Where a delayed message waits (delay levels and arbitrary delays): the one seam the send,
    transaction and retry paths route a delay through."""

    def __init__(self, levels_ms: tuple[int, ...], max_delay_ms: int,
                 on_first_delay: Callable[[], None] | None = None,
                 lookup: Callable[[str, str | None], dict[str, Any] | None] | None = None
                 ) -> None:
        self.levels_ms = levels_ms
        self.max_delay_ms = max_delay_ms
        self.on_first_delay = on_first_delay  # e.g. hold retention for the scheduler
        # the standing of a delayed message by id (delays/service.py's ``DelayLookup``)
        self.lookup = lookup
        self.delays_by_level = 0
        self.delays_by_time = 0

    # --- validation ---------------------------------------------------------------------------
    def due_for(self, now_ms: int, *, delay_level: int = 0, delay_ms: int | None = None,
                deliver_at_ms: int | None = None) -> int | None:
        """Due time of a delay, None to deliver at once; raises INVALID_DELAY."""
        given = [n for n, v in (("delay_level", delay_level or None), ("delay_ms", delay_ms),
                                ("deliver_at_ms", deliver_at_ms)) if v is not None]
        if len(given) > 1:
            raise _invalid(f"give at most one of delay_level, delay_ms, deliver_at_ms; got "
                           f"{', '.join(given)}")
        if delay_level:
            if not 1 <= delay_level <= len(self.levels_ms):
                raise _invalid(f"delay_level must be 1-{len(self.levels_ms)} (or 0 for none), "
                               f"got {delay_level}")
            return now_ms + self.levels_ms[delay_level - 1]
        if delay_ms is not None:
            if not 0 <= delay_ms <= self.max_delay_ms:
                raise _invalid(f"delay_ms must be 0-{self.max_delay_ms} ms (the maximum delay), "
                               f"got {delay_ms}")
            return now_ms + delay_ms if delay_ms else None
        if deliver_at_ms is not None:
            if deliver_at_ms < 0:
                raise _invalid(f"deliver_at_ms must be epoch milliseconds, got {deliver_at_ms}")
            if deliver_at_ms > now_ms + self.max_delay_ms:
                raise _invalid(f"deliver_at_ms {deliver_at_ms} is more than the maximum delay of "
                               f"{self.max_delay_ms} ms from now ({now_ms})")
            return deliver_at_ms if deliver_at_ms > now_ms else None
        return None

    def validate(self, msg: OutgoingMessage, now_ms: int) -> int | None:
        """Due time (epoch ms) of a delayed message, None to deliver at once; raises
        ProtocolError(INVALID_DELAY) for a delay it cannot honour."""
        return self.due_for(now_ms, delay_level=msg.delay_level, delay_ms=msg.delay_ms,
                            deliver_at_ms=msg.deliver_at_ms)

    # --- routing ------------------------------------------------------------------------------
    def route(self, record: MessageRecord, msg: OutgoingMessage, due_ms: int) -> MessageRecord:
        """The record to store instead of ``record`` so that it is delivered at ``due_ms``."""
        return self.waiting_copy(record, due_ms, msg.delay_level)

    @staticmethod
    def waiting(record: MessageRecord | StoredRecord) -> tuple[int, int] | None:
        """``(real queue id, due ms)`` of a waiting copy; None for any other record."""
        if record.topic not in DELAY_TOPICS:
            return None
        props = record.properties
        qid, due = _int(props.get(REAL_QID)), _int(props.get(TIMER_DELIVER_MS))
        return None if qid is None or due is None else (qid, due)

    def standing(self, message_id: str, topic: str | None = None) -> dict[str, Any] | None:
        """What a repeated send of a delayed message learns beyond its first result: fields
        saying it was cancelled (``state``) or where it was delivered (``state``, ``queue_id``,
        ``queue_offset``); None while it still waits."""
        return self.lookup(message_id, topic) if self.lookup is not None else None

    def route_record(self, record: MessageRecord, now_ms: int, *, delay_level: int = 0,
                     delay_ms: int | None = None, deliver_at_ms: int | None = None
                     ) -> MessageRecord:
        """``record`` itself when it is due now, else its waiting copy; raises INVALID_DELAY."""
        due = self.due_for(now_ms, delay_level=delay_level, delay_ms=delay_ms,
                           deliver_at_ms=deliver_at_ms)
        return record if due is None else self.waiting_copy(record, due, delay_level)

    def waiting_copy(self, record: MessageRecord, due_ms: int, level: int = 0) -> MessageRecord:
        """The copy stored instead of ``record`` until ``due_ms``."""
        if self.on_first_delay is not None:
            hold, self.on_first_delay = self.on_first_delay, None
            hold()
        props = dict(record.properties)
        props[REAL_TOPIC] = record.topic
        props[REAL_QID] = str(record.queue_id)
        props[TIMER_DELIVER_MS] = str(due_ms)
        if level:
            props[DELAY] = str(level)
            self.delays_by_level += 1
        else:
            self.delays_by_time += 1
        return MessageRecord(
            topic=DELAY_LEVEL_TOPIC if level else INTAKE_TOPIC, queue_id=level - 1 if level else 0,
            body=record.body, properties=props, tag_code=due_ms, flag=record.flag,
            sys_flag=record.sys_flag, born_timestamp=record.born_timestamp,
            born_host=record.born_host, reconsume_times=record.reconsume_times,
            prepared_tx_offset=record.prepared_tx_offset)


# --- what a waiting copy is ---------------------------------------------------------------------

def is_consumable(topic: str) -> bool:
    """A topic consumers read: ordinary, retry or DLQ (not a waiting or transaction one)."""
    return not is_system_topic(topic) or topic.startswith((RETRY_PREFIX, DLQ_PREFIX))


def is_waiting(record: StoredRecord) -> bool:
    return record.topic in DELAY_TOPICS and REAL_TOPIC in record.properties


def due_of(record: StoredRecord) -> int | None:
    return _int(record.properties.get(TIMER_DELIVER_MS))


def waiting_fields(record: StoredRecord) -> dict[str, Any]:
    """What a message shown while it waits (scheduled, or cancelled before delivery) says in
    place of a position: no queue offset (it has none until delivered) and its due time."""
    return {"queue_offset": None, "deliver_at_ms": due_of(record)}


def as_delivered_view(record: StoredRecord) -> StoredRecord:
    """A waiting copy shown where it will be delivered (real topic and queue)."""
    props = record.properties
    qid = _int(props.get(REAL_QID))
    return dataclasses.replace(record, topic=props.get(REAL_TOPIC, record.topic),
                               queue_id=record.queue_id if qid is None else qid)


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _invalid(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.INVALID_DELAY, message)
