"""What the broker does for delayed messages beyond routing them
(tidemq_server.broker.delays.routing).

For the scheduler (``/internal/v1/schedule/*``, token required):

- ``levels_due``: walk each delay-level queue from the scheduler's offsets and hand over the
  records whose delivery time (the consume queue's tag slot) has come, in queue order;
- ``deliver``: store due messages in their real topic and queue in one store write per batch,
  keeping message id, body, properties, keys and tags (store time = delivery time); records
  marked ``strict`` (a re-delivery after a crash or a failed request) are first looked up by
  their unique key and not stored again if that delivery already happened;
- ``report_progress``: the scheduler's intake and level offsets become its retention floor, so
  the broker never deletes a segment holding a record the scheduler has not taken yet (for the
  intake topic: its rebuild floor, the oldest record a pending timer depends on);
- ``deliver`` into the intake topic itself is a timer roll (the scheduler re-puts a long timer
  so that its intake record stays recent): the copy's due time goes to the tag slot, as
  routing puts it for a first copy;
- ``cancels``: the ids of ``TIDE_SYS_TIMER_CANCELS``, read back by a scheduler rebuilding its
  timer log.

For clients: ``cancel`` and ``pending_delays`` (docs/api.md) ask the scheduler, which decides; a
successful cancel is also written to ``TIDE_SYS_TIMER_CANCELS`` so the message's state reads
``cancelled`` from the broker's own store.
"""

from __future__ import annotations

import base64
import logging
from typing import Any

import msgpack
from tidemq.protocol import (
    DELAY,
    DELIVERY_FIELDS,
    REAL_QID,
    REAL_TOPIC,
    TAGS,
    TIMER_DELIVER_MS,
    UNIQ_KEY,
    DeliveryRow,
    DueRecord,
    ErrorCode,
    IntakeRow,
    ProtocolError,
    is_system_topic,
    validate_topic_name,
)

from tidemq_server.broker.delays.copies import Standing, by_topic, choose, delivered, settled
from tidemq_server.broker.delays.redelivery import RedeliveryGuard, delivery_key
from tidemq_server.broker.delays.routing import (
    CANCELS_TOPIC,
    DELAY_LEVEL_TOPIC,
    INTAKE_TOPIC,
    WAITING_PROPERTIES,
    DelayRouter,
    due_of,
    is_waiting,
)
from tidemq_server.broker.delays.scheduler_client import SchedulerClient
from tidemq_server.broker.ingest.writes import Ingest
from tidemq_server.broker.internal import records_of
from tidemq_server.broker.messaging.pull import PullService, TagFilter
from tidemq_server.broker.messaging.topics import TopicManager
from tidemq_server.broker.states import delay_standing
from tidemq_server.broker.store.store import MessageStore
from tidemq_server.broker.store.types import MessageRecord, StoredRecord, tag_code
from tidemq_server.common.clock import now_ms
from tidemq_server.common.constants import SCHEDULER_FLOOR_OWNER

log = logging.getLogger(__name__)

MAX_DUE_PER_LEVEL = 4096  # records one levels_due answer carries per level
MAX_DELIVER = 4096  # records per deliver request
MAX_INTAKE = 4096  # timers per intake read
DELIVER_FIELDS = frozenset({"records", "strict"})  # of a deliver request
MAX_SCAN = 1_000_000  # consume-queue units one pending count reads at most


def delivery_row(record: StoredRecord) -> DeliveryRow:
    """A waiting copy as the record to deliver (``tidemq.protocol.DeliveryRow``): what
    ``deliver`` takes and the scheduler's timer log keeps."""
    props = record.properties
    return DeliveryRow(props.get(REAL_TOPIC, record.topic), int(props.get(REAL_QID, "0")),
                       record.body, {k: v for k, v in props.items()
                                     if k not in WAITING_PROPERTIES},
                       record.flag, record.sys_flag, record.born_timestamp, record.born_host,
                       record.reconsume_times, record.prepared_tx_offset)


def parse_delivery(row: Any) -> MessageRecord:
    """A ``delivery_row`` back into a record (its body raw bytes, or base64 text in JSON). The
    scheduler is trusted (token): shapes are checked, values are taken as they come (the hot
    path of a burst of deliveries); a number past its slot in the record is refused by the
    store before the write (400 naming the field)."""
    try:
        r = DeliveryRow._make(row)
        if type(r.body) is str:  # a JSON request: the body as base64 text
            r = r._replace(body=base64.b64decode(r.body, validate=True))
        props = r.properties
        tag = props.get(TAGS)
        ok = type(r.topic) is str and type(r.queue_id) is int and type(r.body) is bytes and \
            type(props.get(UNIQ_KEY)) is str
    except (TypeError, ValueError, AttributeError):  # binascii.Error is a ValueError
        ok = False
    if not ok:
        raise ProtocolError(ErrorCode.BAD_REQUEST,
                            f"a delivery record must be [{', '.join(DELIVERY_FIELDS)}] with "
                            f"a string topic, int queue_id, bytes body and properties.{UNIQ_KEY}")
    return MessageRecord(r.topic, r.queue_id, r.body, props, tag_code(tag) if tag else 0, r.flag,
                         r.sys_flag, r.born_timestamp_ms, r.born_host, r.reconsume_times,
                         r.prepared_tx_offset)


class DelayLookup:
    """What the store says about delayed messages, asked by the delay router (``DelayRouter``,
    built before every service that stores): the standing of a repeated send, and the
    retention hold before the first delay."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store

    def hold_for_scheduler(self) -> None:
        """Before the first delayed message: keep everything from here until the scheduler
        reports its own progress (a scheduler that never ran must not lose timers)."""
        if SCHEDULER_FLOOR_OWNER not in self.store.floors:
            self.store.set_retention_floor(SCHEDULER_FLOOR_OWNER, self.store.log.write_offset)

    def standing(self, message_id: str, topic: str | None = None) -> dict[str, Any] | None:
        """For a repeated send of a delayed message to ``topic`` (``DelayRouter.standing``):
        ``states.delay_standing`` of its copies, read from the store (repeated sends are
        rare)."""
        return delay_standing(self.store.find_by_unique_key(message_id), topic)


class DelayService:
    def __init__(self, store: MessageStore, ingest: Ingest, topics: TopicManager,
                 delay_router: DelayRouter, scheduler: SchedulerClient | None,
                 broker_name: str, pulls: PullService) -> None:
        self.store = store
        self.ingest = ingest  # deliveries and cancel records
        self.pulls = pulls
        self.topics = topics
        self.delay_router = delay_router
        self.scheduler = scheduler
        self.broker_name = broker_name
        self.delivered = 0  # messages stored by deliver
        self.duplicates = 0  # strict re-deliveries found already stored
        self.cancelled = 0
        self.redeliveries = RedeliveryGuard()  # a strict retry racing its first delivery

    async def start(self) -> None:
        await self.topics.ensure_system(DELAY_LEVEL_TOPIC)
        await self.topics.ensure_system(INTAKE_TOPIC)
        await self.topics.ensure_system(CANCELS_TOPIC, 1)

    async def close(self) -> None:
        if self.scheduler is not None:
            await self.scheduler.close()

    # --- for the scheduler ------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        router = self.delay_router
        return {"broker_name": self.broker_name, "delay_levels_ms": list(router.levels_ms),
                "max_delay_ms": router.max_delay_ms, "schedule_topic": DELAY_LEVEL_TOPIC,
                "intake_topic": INTAKE_TOPIC}

    def levels_due(self, offsets: dict[int, int], now: int, max_count: int) -> dict[str, Any]:
        """For each level queue: the due records from its offset, in order, up to the first
        that is not due yet (whose time comes back as ``next_due_ms``)."""
        max_count = max(1, min(max_count, MAX_DUE_PER_LEVEL))
        out: dict[int, dict[str, Any]] = {}
        min_phys = self.store.log.min_offset
        for qid in range(len(self.delay_router.levels_ms)):
            cq = self.store.dispatcher.queues.get((DELAY_LEVEL_TOPIC, qid))
            lo, hi = (cq.min_offset, cq.max_offset) if cq else (0, 0)
            offset = min(max(offsets.get(qid, 0), lo), hi)
            spots: list[tuple[int, int]] = []
            meta: dict[int, tuple[int, int]] = {}  # physical offset → (queue offset, due)
            next_due = None
            pos = offset
            if cq is not None and offset < hi:
                for phys, size, due in cq.read_units(offset, max_count):
                    if due > now:
                        next_due = due
                        break
                    pos += 1
                    if size > 0 and phys >= min_phys:
                        spots.append((phys, size))
                        meta[phys] = (pos - 1, due)
            records: list[DueRecord] = []
            for rec in self.store.read_many(spots):
                qoff, due = meta[rec.physical_offset]
                records.append(DueRecord(offset=qoff, due_ms=due, message_id=rec.message_id,
                                         record=delivery_row(rec)))
            out[qid] = {"records": records, "next_offset": pos, "min_offset": lo,
                        "max_offset": hi, "next_due_ms": next_due}
        return {"levels": out, "now_ms": now}

    async def intake(self, offset: int, max_count: int, wait_ms: int) -> dict[str, Any]:
        """Timers of the intake queue from ``offset``, each an ``IntakeRow`` (what the
        scheduler files as is); holds up to ``wait_ms`` when there is none yet."""
        max_count = max(1, min(max_count, MAX_INTAKE))
        res = self.store.get(INTAKE_TOPIC, 0, offset, max_count)
        records, nxt, lo, hi = res.records, res.next_offset, res.min_offset, res.max_offset
        if not records and nxt >= hi and wait_ms > 0:
            answer = await self.pulls.pull(INTAKE_TOPIC, 0, nxt, max_count, wait_ms,
                                           TagFilter(None), internal=True)
            records, nxt = answer.records, answer.next_offset
            lo, hi = answer.min_offset, answer.max_offset
        packb = msgpack.packb
        timers = [IntakeRow(r.queue_offset, due_of(r) or 0, r.message_id,
                            r.properties.get(REAL_TOPIC, r.topic),
                            packb(delivery_row(r), use_bin_type=True))
                  for r in records]
        return {"timers": timers, "next_offset": nxt, "min_offset": lo, "max_offset": hi}

    def cancels(self, offset: int, max_count: int) -> dict[str, Any]:
        """Ids of the cancel records from ``offset`` and, beside them, their topics (null for
        a record that names none): a scheduler rebuild reads them all."""
        res = self.store.get(CANCELS_TOPIC, 0, offset, max(1, min(max_count, MAX_INTAKE)))
        return {"message_ids": [r.message_id for r in res.records],
                "topics": [r.properties.get(REAL_TOPIC) or None for r in res.records],
                "next_offset": res.next_offset, "min_offset": res.min_offset,
                "max_offset": res.max_offset}

    async def deliver(self, payload: Any) -> dict[str, int]:
        """``{records: [delivery row...], strict: [index...]}`` → stored in one write."""
        items = records_of(payload, DELIVER_FIELDS, "a deliver request", "deliver", MAX_DELIVER)
        marked = payload.get("strict") or []
        if not isinstance(marked, list):
            raise ProtocolError(ErrorCode.BAD_REQUEST, "strict must be a list of record indexes")
        records = [parse_delivery(item) for item in items]
        strict = {i for i in marked if type(i) is int}
        queues: dict[str, int | None] = {}
        for record in records:
            if record.topic not in queues:
                queues[record.topic] = await self._queues_of(record.topic)
            count = queues[record.topic]
            if count and record.queue_id >= count:
                record.queue_id %= count  # the topic shrank while the message waited
            if record.topic == INTAKE_TOPIC:  # a rolled timer: its due time in the tag slot
                due = record.properties.get(TIMER_DELIVER_MS, "")
                if not due.isdigit() or REAL_TOPIC not in record.properties:
                    raise ProtocolError(ErrorCode.BAD_REQUEST,
                                        f"a timer rolled into {INTAKE_TOPIC} needs properties "
                                        f"{REAL_TOPIC} and {TIMER_DELIVER_MS} (epoch ms)")
                record.tag_code = int(due)
        keys = [delivery_key(r) for r in records]
        guard = self.redeliveries
        look = await guard.to_look_up(keys, strict)
        with guard.storing(keys, bool(strict)):
            keep: list[MessageRecord] = []
            settle = 0  # end of the newest copy found stored (perhaps never acknowledged)
            for i, r in enumerate(records):
                end = self._delivered(r) if i in look else 0
                if end:
                    settle = max(settle, end)
                else:
                    keep.append(r)
            if settle:  # a copy above the high-water mark counts once a quorum holds it
                await self.ingest.settle(settle)
            duplicates = len(records) - len(keep)
            if keep:
                await self.ingest.put_records(keep, [False] * len(keep), now_ms())
        self.delivered += len(keep)
        self.duplicates += duplicates
        return {"stored": len(keep), "duplicates": duplicates}

    async def _queues_of(self, topic: str) -> int | None:
        cfg = self.topics.get(topic)
        if cfg is None and is_system_topic(topic):  # a retry topic no one created yet
            cfg, _ = await self.topics.ensure_system(topic, 1)
        if cfg is None:
            validate_topic_name(topic)
            log.warning("delivering to topic %s, which is not in the topic table", topic)
            return None
        return cfg.queues

    def _delivered(self, record: MessageRecord) -> int:
        """Where this very delivery, already stored, ends in the log (same topic, id,
        reconsume count and born time: a re-delivery after a crash or a failed request,
        de-duplicated by the unique key); 0 when it is not stored."""
        mid = record.properties[UNIQ_KEY]
        return max((c.physical_offset + c.size
                    for c in self.store.find_by_unique_key(mid, whole_log=True)
                    if c.topic == record.topic and c.reconsume_times == record.reconsume_times
                    and c.born_timestamp == record.born_timestamp and not is_waiting(c)),
                   default=0)

    def report_progress(self, owner: str, positions: list[tuple[str, int, int]]) -> int:
        """Hold retention at the first record any of ``positions`` (topic, queue, next offset)
        has not consumed; a queue consumed to its end holds from the log's end."""
        floor = self.store.log.write_offset
        for topic, qid, offset in positions:
            cq = self.store.dispatcher.queues.get((topic, qid))
            if cq is None or offset >= cq.max_offset:
                continue
            units = cq.read_units(max(offset, cq.min_offset), 1)
            if units:
                floor = min(floor, units[0][0])
        self.store.set_retention_floor(owner or SCHEDULER_FLOOR_OWNER, floor)
        return floor

    def pending(self, offsets: dict[int, int], intake_offset: int, topic: str | None,
                skip: set[tuple[int, int]]) -> dict[str, Any]:
        """What waits on this broker beyond the scheduler's offsets: per level queue (count and
        next due time, cancelled ``skip`` left out) and on the intake topic (not taken in yet).
        Without ``topic`` only consume-queue units are read; with it, the records too."""
        by_queue: dict[int, int] = {}
        level_due: int | None = None
        for qid in range(len(self.delay_router.levels_ms)):
            n, due = self._count(DELAY_LEVEL_TOPIC, qid, offsets.get(qid, 0), topic,
                                 {o for q, o in skip if q == qid}, first_only=True)
            by_queue[qid] = n
            if due is not None:
                level_due = due if level_due is None else min(level_due, due)
        intake, intake_due = self._count(INTAKE_TOPIC, 0, intake_offset, topic, set(),
                                         first_only=False)
        return {"by_queue": by_queue, "next_due_ms": level_due, "intake_pending": intake,
                "intake_next_due_ms": intake_due}

    def _count(self, topic: str, qid: int, offset: int, real_topic: str | None,
               skip: set[int], first_only: bool) -> tuple[int, int | None]:
        """(waiting records from ``offset``, earliest due time); a level queue is in due
        order (``first_only``), the intake queue is not. Scans at most MAX_SCAN units."""
        cq = self.store.dispatcher.queues.get((topic, qid))
        if cq is None:
            return 0, None
        offset = max(offset, cq.min_offset)
        count, first = 0, None
        end = min(cq.max_offset, offset + MAX_SCAN)
        if real_topic is None and first_only:
            count = max(0, cq.max_offset - offset) - sum(1 for o in skip if o >= offset)
            end = min(end, offset + len(skip) + 1)  # the first unit not cancelled is enough
        while offset < end:
            units = cq.read_units(offset, min(1024, end - offset))
            if not units:
                break
            wanted = {phys: due for i, (phys, size, due) in enumerate(units)
                      if size > 0 and offset + i not in skip}
            if real_topic is None:
                if not first_only:
                    count += len(wanted)
                dues = list(wanted.values())
            else:
                spots = sorted((p, sz) for p, sz, _ in units if p in wanted)
                dues = [wanted[r.physical_offset] for r in self.store.read_many(spots)
                        if r.properties.get(REAL_TOPIC) == real_topic]
                count += len(dues)
            if dues:
                first = min(dues) if first is None else min(first, *dues)
                if first_only and real_topic is None:
                    break
            offset += len(units)
        return max(0, count), first

    # --- for clients ------------------------------------------------------------------------
    def _require_scheduler(self) -> SchedulerClient:
        if self.scheduler is None:
            raise ProtocolError(ErrorCode.UNAVAILABLE,
                                "no scheduler is configured on this broker (set "
                                "TIDEMQ_BROKER_SCHEDULER_URL, or start it with `tidemq up`)")
        return self.scheduler

    async def cancel(self, message_id: str, topic: str | None = None) -> dict[str, Any]:
        """Cancel a delayed message of ``topic`` not yet delivered; 409 ALREADY_DELIVERED once
        it was, 404 MESSAGE_NOT_FOUND for an id never stored there as a delayed message.
        Without ``topic``: the only topic where the id waits (services/broker/delays/copies.py;
        409 AMBIGUOUS_MESSAGE_ID when it waits in several). Never touches another topic."""
        if topic is not None:
            validate_topic_name(topic)
        copies = self.store.find_by_unique_key(message_id) if message_id else []
        mine = choose(message_id, by_topic(copies), topic)
        if mine is not None:
            topic = mine.topic
            if mine.standing is Standing.CANCELLED:  # cancelled before: the same answer
                return {"message_id": message_id, "state": "cancelled"}
            settled(message_id, mine)
        hint: dict[str, Any] = {} if topic is None else {"topic": topic}
        newest = mine.newest if mine is not None else None
        if newest is not None:
            hint["due_ms"] = due_of(newest)
            if newest.topic == DELAY_LEVEL_TOPIC:
                hint["level"] = int(newest.properties.get(DELAY, newest.queue_id + 1))
                hint["queue_offset"] = newest.queue_offset
            else:
                hint["intake_offset"] = newest.queue_offset
        try:
            decided = await self._require_scheduler().cancel(message_id, hint)
        except ProtocolError as exc:
            # delivered (and forgotten by the scheduler) since the copies were read above?
            latest = by_topic(self.store.find_by_unique_key(message_id)).get(topic or "")
            if exc.code is ErrorCode.MESSAGE_NOT_FOUND and latest is not None and \
                    latest.standing is Standing.DELIVERED:
                raise delivered(message_id, latest.newest.topic) from None
            if exc.code is ErrorCode.MESSAGE_NOT_FOUND and newest is not None:
                # the store holds it waiting: say which copy the scheduler was pointed at
                raise ProtocolError(exc.code, f"{exc.message}; the broker holds it waiting "
                                    f"(cancel hint {hint})") from None
            raise
        topic = topic or decided.get("topic") or None  # found by the scheduler alone
        await self._record_cancel(message_id, topic, newest, hint)
        self.cancelled += 1
        log.info("cancelled delayed message %s of %s (due %s)", message_id, topic,
                 hint.get("due_ms"))
        return {"message_id": message_id, "state": "cancelled"}

    async def _record_cancel(self, message_id: str, topic: str | None,
                             waiting: StoredRecord | None, hint: dict[str, Any]) -> None:
        """The cancel record, keyed by (topic, id): read back by the message's state, a
        repeated cancel and a scheduler rebuild."""
        props = {UNIQ_KEY: message_id, REAL_TOPIC: topic or ""}
        if waiting is not None and REAL_QID in waiting.properties:
            props[REAL_QID] = waiting.properties[REAL_QID]
        if hint.get("due_ms") is not None:
            props[TIMER_DELIVER_MS] = str(hint["due_ms"])
        record = MessageRecord(topic=CANCELS_TOPIC, queue_id=0, body=b"",
                               properties=props, born_timestamp=now_ms())
        await self.topics.ensure_system(CANCELS_TOPIC, 1)
        await self.ingest.write([record], counted=False)

    async def pending_delays(self, topic: str | None) -> dict[str, Any]:
        """``GET /v1/scheduled``: the delays waiting (of ``topic``), as the scheduler counts
        them."""
        if topic:
            validate_topic_name(topic)
        return await self._require_scheduler().scheduled(topic or None)

    async def histogram(self, by: str) -> dict[str, Any]:
        """Pending timers by hour or day of due time, as the scheduler counts them."""
        return await self._require_scheduler().histogram(by)
