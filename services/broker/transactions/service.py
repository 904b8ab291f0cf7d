"""Transactional messages, producer side: half messages, end-transaction, the check channel.

- ``begin``: validate like a send, store each message as a half copy (invisible) plus a ``half``
  event in one store write (``halves.py``); a retried half (same topic and message id in the
  dedup window) answers its first transaction id.
- ``begin_batches``: half messages as producer-made batches (checked by ``ingest/halves.py``,
  stored by ``halves.py``): the common case appends the batches as they came with their
  ``half`` events (one group commit); a retried half answers its first transaction id and the
  rest are re-encoded.
- ``end``: under the transactions' locks, decide each end against the durable state (commit:
  commit copy + op record + event; rollback: op record + event; unknown: event only), write
  everything of a batch in ONE store write, then update memory. The write runs as its
  own task, so a client that disconnects mid-write cannot leave memory behind the log. Ending
  again with the same action answers the same state; a different action → 409
  TRANSACTION_ALREADY_ENDED.
- ``poll_checks``: the long poll producers answer checks from (``CheckChannel``).

Every write goes through ``Ingest`` (ingest/writes.py), the broker's one write path.
The checker's side (scan pages, check/discard actions, restart rebuild, message states) is in
``checker_requests.py``; the records and their properties in ``model.py``.
"""
from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import Counter
from tidemq.protocol import (
    TAGS,
    TRANSACTION_ID,
    ErrorCode,
    EventKind,
    OutgoingMessage,
    ProtocolError,
    parse_messages,
)

from tidemq_server.broker.consumers.membership import ProducerRegistry
from tidemq_server.broker.ingest.halves import batch_answer, parse_halves
from tidemq_server.broker.ingest.writes import Ingest
from tidemq_server.broker.messaging.convert import new_message_id, to_wire
from tidemq_server.broker.messaging.send import SendService
from tidemq_server.broker.messaging.topics import TopicManager
from tidemq_server.broker.observability import BrokerMetrics
from tidemq_server.broker.store.records.v2_own import Batch
from tidemq_server.broker.store.store import MessageStore
from tidemq_server.broker.store.types import Appended, MessageRecord, StoredRecord, tag_code
from tidemq_server.broker.transactions.batches import CommitCopies, EventBatches
from tidemq_server.broker.transactions.check_channel import CheckChannel
from tidemq_server.broker.transactions.halves import HalfWriter
from tidemq_server.broker.transactions.model import (
    DISCARD_TOPIC,
    EVENTS_TOPIC,
    HALF_TOPIC,
    OP_TOPIC,
    OpEntry,
    TxAction,
    TxInfo,
    TxState,
    commit_copy,
    event_for,
    op_records,
    user_keys,
)
from tidemq_server.broker.transactions.requests import (
    MAX_ENDS,
    EndRequest,
    batch_target,
    delayed_message,
    parse_begin,
    parse_end,
    parse_ends,
    parse_group,
)
from tidemq_server.broker.transactions.table import HalfCache, HalfDedup, KeyedLocks, TxTable
from tidemq_server.common.clock import now_ms

log = logging.getLogger(__name__)

__all__ = ["MAX_ENDS", "EndRequest", "TransactionService", "parse_end", "parse_ends",
           "parse_group"]

SYSTEM_TOPICS = (HALF_TOPIC, OP_TOPIC, DISCARD_TOPIC, EVENTS_TOPIC)
MAX_CHECKS_PER_POLL = 1024
HALF_CACHE_BYTES = 64 * 1024 * 1024  # bodies of recent half records kept for their commit


class TransactionService:
    def __init__(self, store: MessageStore, ingest: Ingest, topics: TopicManager,
                 sender: SendService, producers: ProducerRegistry, metrics: BrokerMetrics, *,
                 reject: bool, dedup_window_s: float, dedup_max_entries: int,
                 check_hold_s: float, max_ended: int,
                 half_cache_bytes: int = HALF_CACHE_BYTES) -> None:
        self.store = store
        self.ingest = ingest  # every write
        self.topics = topics
        self.sender = sender
        self.producers = producers
        self.metrics = metrics
        self.reject = reject
        self._topics_ready = all(topics.get(name) is not None for name in SYSTEM_TOPICS)
        self.max_ended = max_ended
        self.dedup_window_ms = int(dedup_window_s * 1000)
        self.dedup_max_entries = dedup_max_entries
        self.table = TxTable(store, max_ended)
        self.cache = HalfCache(half_cache_bytes)
        self.locks = KeyedLocks()
        self.channel = CheckChannel(check_hold_s)
        # halves stored by an earlier run may be retried: ask the index until the window passed
        earlier = store.queue_offsets(HALF_TOPIC, 0)[1] > 0
        self.dedup = HalfDedup(store, self.dedup_window_ms, dedup_max_entries,
                               now_ms() if earlier else 0)
        self.events = Counter("tidemq_broker_transaction_events",
                              "Transaction state changes by event (half, commit, rollback, "
                              "unknown, check, discard)", ["event"], registry=metrics.registry)
        self.conflicts = Counter("tidemq_broker_transaction_end_conflicts",
                                 "Ends refused with TRANSACTION_ALREADY_ENDED",
                                 registry=metrics.registry)
        for kind in EventKind:
            self.events.labels(kind.value)
        self.halves = HalfWriter(store, ingest, self.table, self.cache, self.dedup, self.count)

    async def start(self) -> None:
        """Nothing to open: the system topics are created with the first half message."""

    async def ensure_topics(self) -> None:
        """Create the transaction system topics (readable through the public pull) once."""
        if not self._topics_ready:
            for name in SYSTEM_TOPICS:
                await self.topics.ensure_system(name)
            self._topics_ready = True

    def close(self) -> None:
        self.channel.close()

    def reload(self, now: int) -> None:
        """Forget what memory holds and learn it from the log again, as after a restart (a
        promoted replica's table may hold loads the log has since moved past): the table
        starts empty and loads on demand; the half dedup consults the index for one window."""
        self.table = TxTable(self.store, self.max_ended)
        self.dedup = HalfDedup(self.store, self.dedup_window_ms, self.dedup_max_entries, now)
        self.halves.use(self.table, self.dedup)

    async def write(self, records: list[MessageRecord], batches: list[Batch] | None = None
                    ) -> list[Appended]:
        """One store write (``batches`` made already, then ``records``); ProtocolError
        (BROKER_BUSY, DISK_FULL, ...) when it fails."""
        if batches:
            return await self.ingest.write_batches(batches, records)
        return await self.ingest.write(records)

    def count(self, records: list[MessageRecord] | EventBatches) -> None:
        """Count the events among ``records`` (or those of ``EventBatches``) by kind."""
        kinds = records.kinds if isinstance(records, EventBatches) else collections.Counter(
            r.properties.get(TAGS, "") for r in records if r.topic == EVENTS_TOPIC)
        for kind, n in kinds.items():
            self.events.labels(kind).inc(n)

    # --- half messages -------------------------------------------------------------------------

    def require_enabled(self) -> None:
        if self.reject:
            raise ProtocolError(ErrorCode.TRANSACTIONS_DISABLED,
                                "this broker rejects transactional messages "
                                "(TIDEMQ_BROKER_REJECT_TRANSACTIONS); send them to another "
                                "broker or send plain messages")

    async def begin(self, payload: Any, host: str) -> dict[str, Any]:
        """``POST /v1/transactions``: store half messages; the answer of docs/api.md."""
        self.require_enabled()
        group, topic, single, immunity = parse_begin(payload)
        cfg = await self.sender.writable_topic(topic)
        await self.ensure_topics()
        msgs = parse_messages({"messages": [payload["message"]] if single
                               else payload["messages"]}, self.sender.limits)
        now = now_ms()
        plan: list[tuple[OutgoingMessage, int, str]] = []
        for msg in msgs:
            due = self.sender.delay_router.validate(msg, now)  # refuses what cannot be honoured
            plan.append((msg, self.sender.select_queue(cfg, msg),
                         msg.message_id or new_message_id()))
            if due is None:
                msg.delay_level, msg.delay_ms, msg.deliver_at_ms = 0, None, None
        ends = parse_ends(payload.get("ends"), optional=True)
        mids = [mid for _, _, mid in plan]
        taken = await self.locks.acquire("m\0" + m for m in mids)
        try:
            store = self.halves.store_messages(group, topic, plan, immunity, host, now)
            if ends:  # ends riding along (the SDK's coalescing): written in the same group commit
                txids, ended = await asyncio.gather(store, self.end(group, ends))
            else:
                txids, ended = await store, []
        finally:
            self.locks.release(taken)
        results = [{"transaction_id": t, "message_id": m} for t, m in zip(txids, mids,
                                                                          strict=True)]
        answer: dict[str, Any] = results[0] if single else {"transactions": results}
        if ends:
            answer["results"] = ended
        return answer

    async def begin_batches(self, group: str | None, topic: str | None, raw: bytes,
                            host: str) -> dict[str, Any]:
        """``POST /v1/transactions?producer_group=&topic=`` with half batches."""
        self.require_enabled()
        group, topic = batch_target(group, topic)
        cfg = await self.sender.writable_topic(topic)
        summaries, halves = parse_halves(group, topic, raw, cfg.queues, self.sender.limits)
        await self.ensure_topics()
        now = now_ms()
        taken = await self.locks.acquire([*("m\0" + h.message_id for h in halves),
                                          *(h.txid for h in halves)])
        try:
            txids = await self.halves.store_batches(group, topic, raw, summaries, halves,
                                                    host, now)
        finally:
            self.locks.release(taken)
        return batch_answer(txids, halves)

    # --- ending --------------------------------------------------------------------------------

    async def end(self, group: str | None, ends: list[EndRequest]) -> list[dict[str, Any]]:
        """Apply ``ends``; one result per end: ``{transaction_id, state}`` or ``{transaction_id,
        code, message}``. A store failure fails the whole call (nothing was decided)."""
        if not 1 <= len(ends) <= MAX_ENDS:
            raise ProtocolError(ErrorCode.BAD_REQUEST, f"send 1-{MAX_ENDS} ends")
        task = asyncio.ensure_future(self._end_locked(group, ends))
        return await asyncio.shield(task)

    async def _end_locked(self, group: str | None, ends: list[EndRequest]
                          ) -> list[dict[str, Any]]:
        taken = await self.locks.acquire(e.txid for e in ends)
        try:
            await self._settle_unseen(ends)
            return await self._end(group, ends)
        finally:
            self.locks.release(taken)

    async def _settle_unseen(self, ends: list[EndRequest]) -> None:
        """A transaction loaded while the log held more than a quorum had confirmed (after a
        failed write here, or on a promoted replica) may have its end up there, unseen by the
        load: decide only once the write gate settles that part of the log (a writable primary
        whose quorum holds it; NOT_ENOUGH_REPLICAS / NOT_PRIMARY otherwise, and the client
        retries), so that ``ensure`` sees it. Else a retried commit wrote a second commit copy,
        and the quorum confirmed both (the faults suite: a committed transaction stored twice)."""
        unseen = 0
        for req in ends:
            info = self.table.ensure(req.txid)
            if info is not None and info.unseen is not None:
                unseen = max(unseen, info.unseen[1])
        if unseen:
            await self.ingest.settle(unseen)

    async def _end(self, group: str | None, ends: list[EndRequest]) -> list[dict[str, Any]]:
        now = now_ms()
        results: list[dict[str, Any]] = [{} for _ in ends]
        decided: dict[str, TxAction] = {}  # within this batch
        records: list[MessageRecord] = []
        ops: list[OpEntry] = []
        changes: list[tuple[TxInfo, TxState]] = []
        copies = CommitCopies(self.ingest.batch_bytes)  # commits from their stored halves
        events = EventBatches(self.ingest.batch_bytes)
        halves = self._prefetch(ends)
        for i, req in enumerate(ends):
            try:
                info = self._find(req.txid, group)
                action = req.action
                final = action.final_state  # (enum properties: looked up once)
                earlier = decided.get(req.txid)  # an end of the same id earlier in this batch
                state = earlier.final_state if earlier is not None else info.state
                ended = state is not TxState.HALF
                if ended and final is not state:
                    self.conflicts.inc()
                    raise ProtocolError(ErrorCode.TRANSACTION_ALREADY_ENDED,
                                        f"transaction {req.txid} is already {state.value}; it "
                                        f"cannot be ended with {action.value}")
                if ended or earlier is action:  # a repeat: same answer, no new record
                    results[i] = {"transaction_id": req.txid, "state": state.value}
                    continue
                source = req.source
                if action is TxAction.COMMIT:
                    kept = self.cache.kept(info.txid)
                    if copies.takes(kept):
                        copies.add(kept, info)
                    else:
                        records.append(self._commit_record(info, now,
                                                           halves.get(info.latest_offset)))
                if action is not TxAction.UNKNOWN:
                    ops.append((req.txid, action.value, source))
                    changes.append((info, final))
                events.add(event_for(action), source, info, now)
                decided[req.txid] = action
                results[i] = {"transaction_id": req.txid, "state": final.value}
            except ProtocolError as exc:
                results[i] = {"transaction_id": req.txid, **exc.to_wire()}
        if events:  # every decided end has its event
            records.extend(op_records(ops, now))
            try:
                await self.write(records, [*copies.batches(), *events.batches()])
            except BaseException:
                for info, _ in changes:
                    self.forget(info.txid)  # outcome unknown: reload from the store
                raise
            for info, state in changes:
                self.ended(info, state)
            self.count(events)
        return results

    def ended(self, info: TxInfo, state: TxState) -> None:
        info.state = state
        self.table.put(info)
        self.cache.pop(info.txid)
        self.channel.withdraw(info.group, info.txid)

    def forget(self, txid: str) -> None:
        self.table.forget(txid)
        self.cache.pop(txid)

    def _find(self, txid: str, group: str | None) -> TxInfo:
        info = self.table.ensure(txid)
        if info is None:
            raise ProtocolError(ErrorCode.TRANSACTION_NOT_FOUND,
                                f"no transaction {txid!r} on this broker (unknown id, or its "
                                "half message is past retention); end it on the broker that "
                                "stored it")
        if group is not None and info.group != group:
            raise ProtocolError(ErrorCode.BAD_REQUEST,
                                f"transaction {txid} belongs to producer group {info.group!r}, "
                                f"not {group!r}")
        return info

    def half_of(self, info: TxInfo) -> StoredRecord | MessageRecord:
        """The transaction's message: the record this run wrote, else its newest stored copy."""
        return self.cache.get(info.txid) or self.read_half(info)

    def read_half(self, info: TxInfo) -> StoredRecord:
        for offset in (info.latest_offset, info.first_offset):
            rec = self.store.read(offset)
            if rec is not None and rec.properties.get(TRANSACTION_ID) == info.txid:
                return rec
        raise ProtocolError(ErrorCode.TRANSACTION_NOT_FOUND,
                            f"the half message of transaction {info.txid} is no longer stored")

    def _prefetch(self, ends: list[EndRequest]) -> dict[int, StoredRecord]:
        """The half copies a batch of commits needs, read with as few preads as possible."""
        spots = set()
        for req in ends:
            if req.action is TxAction.COMMIT and req.txid not in self.cache:
                info = self.table.ensure(req.txid)
                if info is not None and info.state is TxState.HALF and info.latest_size > 0:
                    spots.add((info.latest_offset, info.latest_size))
        if not spots:
            return {}
        return {r.physical_offset: r for r in self.store.read_many(sorted(spots))}

    def _commit_record(self, info: TxInfo, now: int,
                       stored: StoredRecord | None = None) -> MessageRecord:
        half: StoredRecord | MessageRecord | None = self.cache.get(info.txid)
        if half is None:
            half = stored if stored is not None and \
                stored.properties.get(TRANSACTION_ID) == info.txid else self.read_half(info)
        record = commit_copy(half, info, tag_code(half.properties.get(TAGS)))
        delayed = delayed_message(half)
        if delayed is not None:
            due = self.sender.delay_router.validate(delayed, now)  # counted from the commit
            if due is not None:
                routed = self.sender.delay_router.route(record, delayed, due)
                routed.sys_flag |= record.sys_flag
                return routed
        return record

    # --- visibility and checks -----------------------------------------------------------------

    def pending(self, group: str | None, max_count: int) -> list[dict[str, Any]]:
        return [i.to_wire() for i in self.table.pending(group)[:max_count]]

    def heartbeat(self, group: str, client_id: str) -> None:
        """A producer is alive: its poll waiting on ``group`` may take checks now."""
        self.producers.heartbeat(group, client_id)
        self.channel.wake(group)

    def leave(self, group: str, client_id: str) -> None:
        """A producer left: it gets no more checks; the group's waiting polls look again."""
        self.producers.leave(group, client_id)
        self.channel.wake(group)

    async def poll_checks(self, group: str, client_id: str, max_count: int, wait_ms: int,
                          binary: bool, gone: Callable[[], Awaitable[bool]] | None = None,
                          ) -> list[dict[str, Any]]:
        """Checks for one producer (long poll); ``gone`` tells whether it hung up."""
        if not client_id:
            raise ProtocolError(ErrorCode.BAD_REQUEST, "client_id must be a non-empty string")
        max_count = max(1, min(max_count, MAX_CHECKS_PER_POLL))
        tickets = await self.channel.take(
            group, max_count, max(0, wait_ms) / 1000,
            lambda: self.producers.is_live(group, client_id), gone)
        live = [t for t in tickets if not ((i := self.table.get(t.txid)) and i.state.ended)]
        spots = sorted({(t.physical_offset, t.size) for t in live})
        found = {r.physical_offset: r for r in self.store.read_many(spots)}
        out = []
        for t in live:
            rec = found.get(t.physical_offset)
            if rec is None:
                continue
            message = to_wire(rec, binary, topic=t.topic, queue_id=t.queue_id, queue_offset=0)
            message["keys"] = user_keys(rec, t.txid)
            out.append({"transaction_id": t.txid, "message_id": t.message_id, "topic": t.topic,
                        "check_times": t.check_times, "message": message})
        return out

    def stats(self) -> dict[str, float]:
        return {
            "pending": float(len(self.table)),
            "loads": float(self.table.loads),
            "checks_held": float(len(self.channel)),
            "checks_offered": float(self.channel.offered),
            "checks_handed_out": float(self.channel.handed_out),
            "checks_expired": float(self.channel.expired),
            "check_pollers": float(self.channel.waiting_pollers()),
            "check_polls_woken": float(self.channel.woken),
        }
