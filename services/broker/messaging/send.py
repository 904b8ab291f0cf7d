"""The send path: validate a batch as a whole, pick queues, store, answer.

Hot path: no pydantic, no Redis, one store write per request through ``Ingest.put_records``
(ingest/writes.py: de-duplication, the shielded write, metrics, the outcome), metrics counted per
batch. Where a send goes and what it answers is ``placement.py``; producer-made batches are
``batch_send.py``. Delayed delivery goes through one seam, ``DelayRouter``
(``tidemq_server.broker.delays.routing``): it validates a message's delay and stores a delayed
message as its waiting copy.
"""

from __future__ import annotations

from typing import Any

from tidemq.protocol import Limits, OutgoingMessage, parse_messages

from tidemq_server.broker.delays.routing import DelayRouter
from tidemq_server.broker.ingest.dedup import Placed
from tidemq_server.broker.ingest.writes import Ingest
from tidemq_server.broker.messaging.batch_send import BatchSend
from tidemq_server.broker.messaging.convert import new_message_id, to_record
from tidemq_server.broker.messaging.placement import Placement
from tidemq_server.broker.messaging.topics import TopicConfig, TopicManager
from tidemq_server.broker.store.types import MessageRecord
from tidemq_server.common.clock import now_ms
from tidemq_server.common.logs import note_message_ids


class SendService:
    def __init__(self, ingest: Ingest, topics: TopicManager, limits: Limits,
                 delay_router: DelayRouter, *, auto_create_queues: int | None = None) -> None:
        self.ingest = ingest  # every write (ingest/writes.py)
        self.limits = limits
        self.delay_router = delay_router
        # a send request's body at most: JSON may escape a byte into up to 6 characters
        self.max_request_bytes = 6 * limits.max_batch_bytes + 1024 * 1024
        self.placement = Placement(topics, delay_router, auto_create_queues)
        self.batches = BatchSend(ingest, self.placement, delay_router, limits)

    async def writable_topic(self, topic: str) -> TopicConfig:
        """The topic a public send may write, creating it when auto-creation is on."""
        return await self.placement.writable_topic(topic)

    def select_queue(self, cfg: TopicConfig, msg: OutgoingMessage) -> int:
        return self.placement.select_queue(cfg, msg)

    async def send(self, topic: str, payload: Any, host: str) -> list[dict[str, Any]]:
        """Store a ``{messages: [...]}`` request; the results in request order."""
        cfg = await self.placement.writable_topic(topic)
        msgs = parse_messages(payload, self.limits)
        now = now_ms()
        records: list[MessageRecord] = []
        ids: list[str] = []
        given: list[bool] = []
        # validate everything and build the records before anything is stored
        validate_delay = self.delay_router.validate
        select_queue = self.placement.select_queue
        for msg in msgs:
            due = (validate_delay(msg, now) if msg.delay_level or msg.delay_ms is not None
                   or msg.deliver_at_ms is not None else None)
            queue_id = select_queue(cfg, msg)
            mid = msg.message_id or new_message_id()
            record = to_record(msg, topic, queue_id, mid, now, host)
            if due is not None:
                record = self.delay_router.route(record, msg, due)
            records.append(record)
            ids.append(mid)
            given.append(msg.message_id is not None)
        note_message_ids(ids)  # for JSON log lines; nothing with text logs
        repeated: set[int] = set()
        placed = await self.ingest.put_records(records, given, now, repeated)
        return self.results(ids, placed, repeated, topic)

    async def send_batches(self, topic: str, raw: bytes, host: str) -> dict[str, Any]:
        """Store a request of producer-made v2 batches (``messaging/batch_send.py``)."""
        return await self.batches.send(topic, raw, host)

    def results(self, ids: list[str], placed: list[Placed], repeated: set[int],
                topic: str | None = None) -> list[dict[str, Any]]:
        """A send's answer per message (to ``topic``), in request order."""
        return self.placement.results(ids, placed, repeated, topic)
