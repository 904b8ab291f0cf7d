"""Where a public send goes and what it answers: the writable topic (created when auto-creation
is on), the queue of each message, and each message's result once ``Ingest`` placed it.

Shared by the JSON/msgpack send (``send.py``), the batch send (``batch_send.py``) and
transactions, none of which needs the others for it.
"""

from __future__ import annotations

import itertools
import zlib
from typing import Any

from tidemq.protocol import (
    ErrorCode,
    OutgoingMessage,
    Perm,
    ProtocolError,
    is_system_topic,
    validate_topic_name,
)

from tidemq_server.broker.delays.routing import DelayRouter
from tidemq_server.broker.ingest.dedup import Placed
from tidemq_server.broker.messaging.query import MessageState
from tidemq_server.broker.messaging.topics import TopicConfig, TopicManager


class Placement:
    def __init__(self, topics: TopicManager, delay_router: DelayRouter,
                 auto_create_queues: int | None = None) -> None:
        self.topics = topics
        self.delay_router = delay_router
        self.auto_create_queues = auto_create_queues  # None: auto-creation off
        self._round_robin = itertools.count()

    async def writable_topic(self, topic: str) -> TopicConfig:
        """The topic a public send may write, creating it when auto-creation is on."""
        cfg = self.topics.get(topic)
        if cfg is None:
            validate_topic_name(topic)
            if is_system_topic(topic):
                raise _forbidden(topic)
            if self.auto_create_queues is None:
                raise self.topics.not_found(topic)
            cfg, _ = await self.topics.put(topic, self.auto_create_queues, Perm.READ_WRITE)
        elif cfg.system:
            raise _forbidden(topic)
        if not cfg.perm.writable:
            raise ProtocolError(ErrorCode.BAD_REQUEST,
                                f"topic {topic!r} is read-only on this broker (perm "
                                f"{cfg.perm.value!r}); send to a writable broker")
        return cfg

    def select_queue(self, cfg: TopicConfig, msg: OutgoingMessage) -> int:
        if msg.queue_id is not None:
            if msg.queue_id >= cfg.queues:
                raise ProtocolError(ErrorCode.BAD_REQUEST,
                                    f"queue_id {msg.queue_id} does not exist: topic "
                                    f"{cfg.name!r} has queues 0-{cfg.queues - 1}")
            return msg.queue_id
        if msg.sharding_key is not None:
            return zlib.crc32(msg.sharding_key.encode("utf-8")) % cfg.queues
        return next(self._round_robin) % cfg.queues

    def results(self, ids: list[str], placed: list[Placed], repeated: set[int],
                topic: str | None = None) -> list[dict[str, Any]]:
        """A send's answer per message (to ``topic``), in request order."""
        return [{"message_id": mid, "queue_id": p.queue_id, "queue_offset": p.queue_offset}
                if p.waiting is None else self._waiting_result(mid, p, i in repeated, topic)
                for i, (mid, p) in enumerate(zip(ids, placed, strict=True))]

    def _waiting_result(self, message_id: str, placed: Placed, repeated: bool,
                        topic: str | None) -> dict[str, Any]:
        """A delayed message has no position in its queue until it is delivered: the result
        names the queue it will be delivered to, no offset, and its due time. A repeated send
        also says whether it was cancelled or delivered since."""
        assert placed.waiting is not None
        queue_id, due = placed.waiting
        result: dict[str, Any] = {"message_id": message_id, "queue_id": queue_id,
                                  "queue_offset": None, "state": MessageState.SCHEDULED.value,
                                  "deliver_at_ms": due}
        if repeated:
            result.update(self.delay_router.standing(message_id, topic) or {})
        return result


def _forbidden(topic: str) -> ProtocolError:
    return ProtocolError(ErrorCode.FORBIDDEN_SYSTEM_TOPIC,
                         f"{topic!r} is a system topic: it cannot be written through the public "
                         "API (reading it is allowed)")
