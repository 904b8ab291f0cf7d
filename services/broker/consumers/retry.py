"""Consumer retry: a message a group failed to consume goes to ``%RETRY%group``, or to
``%DLQ%group`` once it has been reconsumed more than ``max_reconsume_times``.

The copy keeps the message's identity (UNIQ_KEY), tag, keys and properties, counts one more
reconsume and records the original topic in RETRY_TOPIC. With back-off on (a scheduler is
configured), a retry waits at delay level ``retry_delay_level`` (3 + reconsume count) before it
reaches ``%RETRY%group``, so a failing consumer backs off instead of spinning.
"""

from __future__ import annotations

import logging

from tidemq.protocol import (
    CONSUME_FAILURE,
    MAX_CONSUME_FAILURE_CHARS,
    MAX_RECONSUME_TIMES,
    REAL_TOPIC,
    RETRY_TOPIC,
    TAGS,
    ErrorCode,
    ProtocolError,
    dlq_topic,
    is_system_topic,
    retry_topic,
    validate_group_name,
)

from tidemq_server.broker.delays.routing import WAITING_PROPERTIES, DelayRouter, is_waiting
from tidemq_server.broker.ingest.writes import Ingest
from tidemq_server.broker.messaging.topics import TopicManager
from tidemq_server.broker.observability import BrokerMetrics
from tidemq_server.broker.store.store import MessageStore
from tidemq_server.broker.store.types import MessageRecord, StoredRecord, tag_code
from tidemq_server.common.clock import now_ms

log = logging.getLogger(__name__)

# retries back off from delay level 3 (10 s) upwards (docs/api.md, POST /v1/groups/{group}/retry)
FIRST_RETRY_LEVEL = 3
MAX_DELAY_LEVEL = 18


def retry_delay_level(reconsume_times: int) -> int:
    """The delay level of the ``reconsume_times``-th retry: 3, 4, 5 ... capped at 18.

    RocketMQ's ``3 + reconsumeTimes`` with the count before this retry: 10 s, 30 s, 1 m ...
    """
    return min(FIRST_RETRY_LEVEL + max(reconsume_times - 1, 0), MAX_DELAY_LEVEL)


def latest_copy(copies: list[StoredRecord], group: str) -> StoredRecord:
    """The copy a group's retry continues from: its own retry copy (delivered or still
    waiting out its back-off), else the newest plain one."""
    own = retry_topic(group)
    for rec in reversed(copies):
        if rec.topic == own or not is_system_topic(rec.topic):
            return rec
        if is_waiting(rec) and rec.properties.get(REAL_TOPIC) == own:
            return rec
    return copies[-1]


class RetryService:
    def __init__(self, store: MessageStore, ingest: Ingest, topics: TopicManager,
                 metrics: BrokerMetrics, max_reconsume_times: int,
                 delay_router: DelayRouter | None = None, backoff: bool = False) -> None:
        self.store = store
        self.ingest = ingest
        self.topics = topics
        self.metrics = metrics
        self.max_reconsume_times = max_reconsume_times
        self.delay_router = delay_router  # None: no delayed delivery (a delay_level is refused)
        self.backoff = backoff  # retries wait retry_delay_level(n) before they come back

    async def retry(self, group: str, message_id: str, delay_level: int | None = None, *,
                    dead_letter: bool = False, reason: str | None = None) -> str:
        """Send the message back for ``group``; returns the destination topic.
        ``dead_letter``: straight to the DLQ (a client gave up on it; RocketMQ 5 clients).
        ``reason``: why the consumer failed, kept in the copy's ``CONSUME_FAILURE`` property
        (a copy handed back without one drops the previous copy's reason)."""
        validate_group_name(group)
        router = self.delay_router
        levels = len(router.levels_ms) if router is not None else MAX_DELAY_LEVEL
        if delay_level:
            if not 0 < delay_level <= levels:
                raise ProtocolError(ErrorCode.INVALID_DELAY,
                                    f"delay_level must be 1-{levels} (or 0 for none), "
                                    f"got {delay_level}")
        if delay_level and router is None:
            raise ProtocolError(ErrorCode.INVALID_DELAY,
                                "delayed delivery is not enabled on this broker yet: retry "
                                "without delay_level")
        copies = self.store.find_by_unique_key(message_id) if message_id else []
        if not copies:
            raise ProtocolError(ErrorCode.MESSAGE_NOT_FOUND,
                                f"no message with message_id {message_id!r} is stored on this "
                                "broker: retry it on the broker it was pulled from")
        source = latest_copy(copies, group)
        times = source.reconsume_times + 1
        limit = _max_reconsume(source, self.max_reconsume_times)
        dead = dead_letter or times > limit
        destination = dlq_topic(group) if dead else retry_topic(group)
        await self.topics.ensure_system(destination, 1)
        props = {k: v for k, v in source.properties.items() if k not in WAITING_PROPERTIES}
        props.setdefault(RETRY_TOPIC, source.topic)
        props.pop(CONSUME_FAILURE, None)
        if reason:
            props[CONSUME_FAILURE] = reason[:MAX_CONSUME_FAILURE_CHARS]
        record = MessageRecord(
            topic=destination, queue_id=0, body=source.body, properties=props,
            tag_code=tag_code(props.get(TAGS)), flag=source.flag,
            born_timestamp=source.born_timestamp or now_ms(), born_host=source.born_host,
            reconsume_times=times,
        )
        level = delay_level or (retry_delay_level(times) if self.backoff else 0)
        if not dead and level and router is not None:
            record = router.route_record(record, now_ms(), delay_level=min(level, levels))
        await self.ingest.write([record], counted=False)
        self.metrics.retries.labels("dlq" if dead else "retry").inc()
        if dead:
            log.info("message %s of group %s reconsumed %d times (max %d): moved to %s",
                     message_id, group, times - 1, limit, destination)
        return destination


def _max_reconsume(record: StoredRecord, default: int) -> int:
    raw = record.properties.get(MAX_RECONSUME_TIMES)
    if raw is not None:
        try:
            return int(raw)
        except ValueError:
            pass
    return default
