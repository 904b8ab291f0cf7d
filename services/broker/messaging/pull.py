"""Pull from one queue (docs/api.md "Offsets and queues"), long-polling at the end of the queue.

``offset == max_offset`` waits on the ``PullHold`` until a message arrives or ``wait_ms``
passes; below ``min_offset`` it reads from ``min_offset``; above ``max_offset`` is 400
OFFSET_OUT_OF_RANGE. Tags are filtered by the store using tag codes and confirmed here by the
exact tag string, so an answer may be empty with a larger ``next_offset``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tidemq.protocol import ErrorCode, ProtocolError, validate_topic_name
from tidemq.protocol.tags import TagExpression

from tidemq_server.broker.messaging.longpoll import PullHold
from tidemq_server.broker.messaging.topics import TopicConfig, TopicManager
from tidemq_server.broker.observability import BrokerMetrics
from tidemq_server.broker.store.store import MessageStore
from tidemq_server.broker.store.types import GetResult, GetStatus, StoredRecord, tag_code

MAX_PULL = 1024  # messages per pull
DEFAULT_PULL = 32  # messages per pull when a request names no max
WAIT_SLICE_S = 5.0  # a held pull re-reads its queue at least this often (belt and braces)


class TagFilter(TagExpression):
    """A subscription's tag expression (``TagFilter.parse``: the protocol's one parser) in the
    store's terms: the tag codes of the consume queue and the exact tags of a stored record."""

    __slots__ = ()

    @property
    def codes(self) -> frozenset[int] | None:
        return None if self.tags is None else frozenset(tag_code(t) for t in self.tags)

    @property
    def raw(self) -> frozenset[bytes] | None:
        """The exact tags as a stored record holds them (utf-8)."""
        return None if self.tags is None else frozenset(t.encode("utf-8") for t in self.tags)


@dataclass(slots=True)
class Pulled:
    records: list[StoredRecord]
    next_offset: int
    min_offset: int
    max_offset: int
    woke_ns: int = 0  # monotonic ns when a held pull was woken (0: not held)
    stored: bytes = b""  # a stored-form pull: the records as the log holds them
    count: int = 0  # ... and how many


def _idle(res: GetResult) -> bool:
    """Nothing to answer yet and nothing left to scan: the pull may be held."""
    return not res.found and res.next_offset >= res.max_offset and res.status in (
        GetStatus.NO_MESSAGE, GetStatus.NO_MATCHED, GetStatus.NO_QUEUE,
        GetStatus.OFFSET_TOO_SMALL)


class PullService:
    def __init__(self, store: MessageStore, topics: TopicManager, hold: PullHold,
                 metrics: BrokerMetrics, long_poll_max_ms: int) -> None:
        self.store = store
        self.topics = topics
        self.hold = hold
        self.metrics = metrics
        self.long_poll_max_ms = long_poll_max_ms
        self.closing = False

    def close(self) -> None:
        """Release every held pull now (shutdown): they answer with what they have."""
        self.closing = True
        self.hold.wake_all()

    def readable_topic(self, topic: str, queue_id: int) -> TopicConfig:
        cfg = self.topics.require(topic)
        if not cfg.perm.readable:
            raise ProtocolError(ErrorCode.BAD_REQUEST,
                                f"topic {topic!r} is write-only on this broker (perm "
                                f"{cfg.perm.value!r}); pull from a readable broker")
        if queue_id >= cfg.queues:
            raise ProtocolError(ErrorCode.BAD_REQUEST,
                                f"queue_id {queue_id} does not exist: topic {topic!r} has queues "
                                f"0-{cfg.queues - 1}")
        return cfg

    async def pull(self, topic: str, queue_id: int, offset: int, max_count: int, wait_ms: int,
                   tags: TagFilter, *, group: str | None = None,
                   internal: bool = False, stored: bool = False) -> Pulled:
        """Read up to ``max_count`` messages from ``offset``, holding up to ``wait_ms`` for one.

        ``group`` (optional) only feeds the consumer lag gauge. ``internal`` pulls (checker,
        scheduler) may read topics not in the topic table yet. ``stored``: answer with the
        records' stored bytes (``Pulled.stored``) rather than decoded records.
        """
        if internal:
            validate_topic_name(topic)
        else:
            self.readable_topic(topic, queue_id)
        max_count = max(1, min(max_count, MAX_PULL))
        wait_s = max(0, min(wait_ms, self.long_poll_max_ms)) / 1000
        res = self._get(topic, queue_id, offset, max_count, tags, stored)
        woke_ns = 0
        if wait_s > 0 and _idle(res):
            deadline = time.monotonic() + wait_s
            key = [(topic, queue_id)]
            while not self.closing and _idle(res):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                # caught up (messages of other tags skipped): hold from the end of the queue
                offset = res.next_offset
                await self.hold.wait(key, min(remaining, WAIT_SLICE_S))
                woke_ns = time.monotonic_ns()
                res = self._get(topic, queue_id, offset, max_count, tags, stored)
        records = res.records
        if tags.tags is not None and records:
            records = [r for r in records if tags.matches(r.tag)]
        if not internal:
            self.metrics.observe_pull(topic, len(records) or res.count)
            if group:
                self.metrics.consumer_lag.labels(group, topic, str(queue_id)).set(
                    max(0, res.max_offset - res.next_offset))
        return Pulled(records, res.next_offset, res.min_offset, res.max_offset, woke_ns,
                      res.stored, res.count)

    def _get(self, topic: str, queue_id: int, offset: int, max_count: int,
             tags: TagFilter, stored: bool = False) -> GetResult:
        res = (self.store.get_stored(topic, queue_id, offset, max_count, tags.codes, tags.raw)
               if stored else self.store.get(topic, queue_id, offset, max_count, tags.codes))
        status = res.status
        if status is GetStatus.OFFSET_OVERFLOW or (status is GetStatus.NO_QUEUE
                                                    and offset > res.max_offset):
            raise ProtocolError(ErrorCode.OFFSET_OUT_OF_RANGE,
                                f"offset {offset} is beyond the end of {topic} queue {queue_id} "
                                f"(min_offset {res.min_offset}, max_offset {res.max_offset})")
        if status is GetStatus.OFFSET_TOO_SMALL and res.next_offset < res.min_offset:
            return self._get(topic, queue_id, res.min_offset, max_count, tags, stored)
        return res
