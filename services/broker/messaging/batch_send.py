"""The send path for producer-made batches (``application/x-tidemq-batch``): record format v2
as the log stores it (``tidemq.protocol.records.v2``), appended without decoding a body.

A request body is one or more batches, each for one queue of the request's topic. In order:

1. every batch is validated whole before anything is stored (``ingest/checks.py``, strict:
   sizes, CRCs, ids, tags, keys, properties with no reserved name but the sharding key,
   delays, limits); the first failure is a 400 (or 413) naming the batch, the record index and
   the field, e.g. ``batches[1].records[3].crc: ...``. Then the request as a whole: its topic
   (writable, each batch names it), each batch's queue (one the topic has) and sys_flag (0),
   and the API's batch limits over every batch together;
2. the common case — no record delayed, no message id seen before (the dedup layers of
   ``ingest/dedup.py``: the recent map, the writes in flight, the unique-key index), no id
   twice in the request — appends the batches as they are (``Ingest.put_batches``, one group
   commit) and answers compactly: per batch its queue, the queue offset of its first record and its
   count (record i of a batch is at that offset + i);
3. anything else — a delayed record (its waiting copy goes to a system topic), a duplicate —
   is rare: the request's records are decoded into store records and take the JSON/msgpack
   path (``Ingest.put_records``), which answers per message as a JSON send does (and,
   as a JSON send, refuses one id twice in the request with other content: 400).
"""

from __future__ import annotations

from typing import Any

from tidemq.protocol import ProtocolError
from tidemq.protocol.message import Limits
from tidemq.protocol.records.v2 import DelayKind
from tidemq.protocol.records.v2_read import BatchError, BatchSummary, decode_record

from tidemq_server.broker.delays.routing import DelayRouter
from tidemq_server.broker.ingest.checks import parse_batches
from tidemq_server.broker.ingest.writes import Ingest
from tidemq_server.broker.messaging.placement import Placement
from tidemq_server.broker.store.records.entry import store_properties
from tidemq_server.broker.store.types import MessageRecord
from tidemq_server.common.clock import now_ms
from tidemq_server.common.logs import ids_wanted, note_message_ids


class BatchSend:
    """``SendService.send_batches``: one request of producer-made batches."""

    def __init__(self, ingest: Ingest, placement: Placement, delay_router: DelayRouter,
                 limits: Limits) -> None:
        self.ingest = ingest
        self.placement = placement
        self.delay_router = delay_router
        self.limits = limits

    async def send(self, topic: str, raw: bytes, host: str) -> dict[str, Any]:
        cfg = await self.placement.writable_topic(topic)
        summaries = parse_batches(topic, raw, cfg.queues, self.limits)
        if ids_wanted():  # JSON log lines name the messages sent
            note_message_ids([mid for s in summaries for mid in s.message_ids])
        now = now_ms()
        ingest = self.ingest
        keys = ingest.fresh_keys(topic, summaries, now)
        if keys is None:
            return {"results": await self._one_by_one(topic, raw, summaries, host, now)}
        placed = await ingest.put_batches(topic, ingest.batches_of(raw, summaries, host), keys)
        return {"batches": [[qid, first, n] for qid, first, n, _ in placed]}

    async def _one_by_one(self, topic: str, raw: bytes, summaries: list[BatchSummary],
                          host: str, now: int) -> list[dict[str, Any]]:
        """The rare path: every record as a store record through ``put_records`` (delays routed,
        duplicates answered with their first result); results per message."""
        router = self.delay_router
        records: list[MessageRecord] = []
        ids: list[str] = []
        seen: dict[str, tuple[int, int, tuple[Any, ...]]] = {}  # id -> batch, record, content
        start = 0  # where batch b starts in the request
        for b, s in enumerate(summaries):
            for k, pos in enumerate(s.positions):
                rec = decode_record(raw, start + pos, k)
                content = (s.head.queue_id, rec.body, rec.tag, tuple(rec.keys),
                           dict(rec.properties), rec.flag, rec.delay_kind, rec.delay_value)
                first = seen.setdefault(rec.message_id, (b, k, content))
                if first[2] != content:  # as a JSON send's parse_messages refuses it
                    raise BatchError("message_id", f"{rec.message_id!r} is also batches["
                                     f"{first[0]}].records[{first[1]}], with other content: "
                                     "one id names one message", k, batch=b)
                record = MessageRecord(topic, s.head.queue_id, rec.body, store_properties(rec),
                                       rec.tag_code, rec.flag, 0, rec.born_timestamp, host)
                kind, value = rec.delay_kind, rec.delay_value
                if kind:
                    try:
                        record = router.route_record(
                            record, now, delay_level=value if kind == DelayKind.LEVEL else 0,
                            delay_ms=value if kind == DelayKind.DELAY_MS else None,
                            deliver_at_ms=value if kind == DelayKind.DELIVER_AT_MS else None)
                    except ProtocolError as exc:
                        raise BatchError("delay_value", exc.message, k, exc.code,
                                         batch=b) from None
                records.append(record)
                ids.append(rec.message_id)
            start += s.head.size
        repeated: set[int] = set()
        placed = await self.ingest.put_records(records, [True] * len(records), now, repeated)
        return self.placement.results(ids, placed, repeated, topic)
