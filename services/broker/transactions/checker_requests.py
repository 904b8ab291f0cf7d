"""Transactional messages, checker side: what ``/internal/v1/transactions/*`` serves.

- ``halves``/``ops``: pages of the half queue (compact metadata, no bodies) and of the op queue
  (the transaction ids they end), for the checker's scan. ``halves`` may hold (``wait_ms``) at
  the end of the queue until a half copy arrives: the checker learns the due time of each new
  half while it sleeps, and wakes for the earliest.
- ``act``: the checker's decisions, each applied under the transaction's lock against the
  durable state: ``check`` re-puts the half copy with its check count + 1 (this counts the
  check, whether or not a producer is alive) and offers the check to the group's pollers;
  ``defer`` re-puts it unchanged (a message whose own immunity is not over); ``discard`` writes it
  to ``TRANS_CHECK_MAX_TIME_TOPIC`` with an op record. A decision about a copy that is no longer
  the transaction's newest (a checker that crashed and re-scans a batch) is ``superseded`` and
  changes nothing — so a restarted checker never checks twice or forks a transaction. Only a
  writable primary decides (a replica answers ``NOT_PRIMARY``, whatever the answers would be):
  the checker passes a copy for good on an ``ended`` or ``superseded`` answer.
- ``rebuild``: after a broker restart, pending transactions are re-read from the half queue
  (from the checker's retention floor on), so ``GET /v1/transactions`` lists them again.
- ``message_view``: the state ``GET /v1/messages/{id}`` shows for a transactional message.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import Any

from tidemq.protocol import (
    CHECK_IMMUNITY_TIME_IN_SECONDS,
    PGROUP,
    REAL_QID,
    REAL_TOPIC,
    TRANSACTION_ID,
    ErrorCode,
    EventKind,
    EventSource,
    ProtocolError,
)
from tidemq.protocol.message import reject_unknown
from tidemq.protocol.numbers import INT64_MAX, integer

from tidemq_server.broker.ingest.writes import Ingest
from tidemq_server.broker.messaging.pull import PullService, TagFilter
from tidemq_server.broker.messaging.query import MessageState
from tidemq_server.broker.messaging.topics import WriteGuard
from tidemq_server.broker.states import transaction_view
from tidemq_server.broker.store.types import MessageRecord, StoredRecord
from tidemq_server.broker.transactions.check_channel import CheckTicket
from tidemq_server.broker.transactions.model import (
    HALF_TOPIC,
    OP_TOPIC,
    OpEntry,
    TxAction,
    TxInfo,
    TxState,
    born_ms_of,
    check_times_of,
    decode_op,
    discard_copy,
    event_record,
    half_copy,
    op_records,
)
from tidemq_server.broker.transactions.service import TransactionService
from tidemq_server.common.clock import now_ms
from tidemq_server.common.constants import CHECKER_FLOOR_OWNER

log = logging.getLogger(__name__)

CHECKER_FLOOR = CHECKER_FLOOR_OWNER  # whose retention floor marks the first pending half
MAX_PAGE = 4096
MAX_ACTIONS = 4096
ACTIONS = frozenset({"check", "defer", "discard"})
REBUILD_PAGE = 512
REBUILD_WAIT_S = 10.0  # a pending listing waits this long for the restart rebuild

_STATE_VIEW = {TxState.HALF: MessageState.HALF, TxState.COMMITTED: MessageState.COMMITTED,
               TxState.ROLLED_BACK: MessageState.ROLLED_BACK,
               TxState.DISCARDED: MessageState.DISCARDED}


class CheckerRequests:
    def __init__(self, service: TransactionService, ingest: Ingest, broker_name: str,
                 pulls: PullService | None = None, guard: WriteGuard | None = None) -> None:
        self.tx = service
        self.ingest = ingest  # the actions' writes
        self.pulls = pulls  # holds a halves request at the end of the queue (None: no hold)
        self.guard = guard  # asked before deciding: only a writable primary decides
        self.store = service.store
        self.broker_name = broker_name
        self.rebuilt = asyncio.Event()
        self._rebuild: asyncio.Task[None] | None = None
        self.rebuilt_count = 0

    # --- scan pages ----------------------------------------------------------------------------

    def _page(self, topic: str, offset: int, max_count: int) -> tuple[list[StoredRecord], int,
                                                                       int, int, int]:
        lo, hi = self.store.queue_offsets(topic, 0)
        offset = lo if offset > hi else max(offset, lo)  # a store wiped under the checker
        res = self.store.get(topic, 0, offset, max(1, min(max_count, MAX_PAGE)))
        nxt = res.next_offset if res.records else max(offset, res.next_offset)
        follow = self.store.get(topic, 0, nxt, 1).records if nxt < hi else []
        next_phys = follow[0].physical_offset if follow else self.store.log.write_offset
        return res.records, nxt, lo, hi, next_phys

    def halves(self, offset: int, max_count: int) -> dict[str, Any]:
        records, nxt, lo, hi, next_phys = self._page(HALF_TOPIC, offset, max_count)
        entries = []
        for r in records:
            p = r.properties
            txid = p.get(TRANSACTION_ID)
            if not txid:
                continue
            immunity = p.get(CHECK_IMMUNITY_TIME_IN_SECONDS)
            entries.append({
                "queue_offset": r.queue_offset, "physical_offset": r.physical_offset,
                "transaction_id": txid, "message_id": r.message_id,
                "producer_group": p.get(PGROUP, ""), "topic": p.get(REAL_TOPIC, ""),
                "check_times": check_times_of(r), "store_timestamp_ms": r.store_timestamp,
                "born_ms": born_ms_of(r),
                "check_immunity_s": float(immunity) if immunity else None,
            })
        return {"entries": entries, "next_offset": nxt, "min_offset": lo, "max_offset": hi,
                "next_physical_offset": next_phys}

    async def halves_held(self, offset: int, max_count: int, wait_ms: int) -> dict[str, Any]:
        """``halves``, held up to ``wait_ms`` when ``offset`` is the end of the half queue."""
        page = self.halves(offset, max_count)
        nxt = int(page["next_offset"])
        if (page["entries"] or wait_ms <= 0 or self.pulls is None
                or nxt < int(page["max_offset"])):
            return page
        await self.pulls.pull(HALF_TOPIC, 0, nxt, 1, wait_ms, TagFilter(None), internal=True)
        return self.halves(offset, max_count)

    def ops(self, offset: int, max_count: int) -> dict[str, Any]:
        records, nxt, lo, hi, next_phys = self._page(OP_TOPIC, offset, max_count)
        txids = [e[0] for r in records for e in decode_op(r)]
        return {"transaction_ids": txids, "next_offset": nxt, "min_offset": lo,
                "max_offset": hi, "next_physical_offset": next_phys}

    # --- the checker's decisions ---------------------------------------------------------------

    async def act(self, payload: Any) -> list[dict[str, Any]]:
        items = payload.get("actions") if isinstance(payload, dict) else None
        if not isinstance(items, list) or not 1 <= len(items) <= MAX_ACTIONS:
            raise ProtocolError(ErrorCode.BAD_REQUEST,
                                f'the body must be {{"actions": [...]}} with 1-{MAX_ACTIONS}')
        reject_unknown(payload, _ACTIONS_FIELDS, "an actions request")
        parsed = []
        for item in items:
            if isinstance(item, dict):
                reject_unknown(item, _ACTION_FIELDS, "an action")
            if (not isinstance(item, dict) or not isinstance(item.get("transaction_id"), str)
                    or not isinstance(item.get("action"), str) or item["action"] not in ACTIONS
                    or "physical_offset" not in item):
                raise ProtocolError(ErrorCode.BAD_REQUEST,
                                    "each action is {transaction_id, physical_offset, action: "
                                    "check|defer|discard}")
            offset = integer(item["physical_offset"], "physical_offset", 0, INT64_MAX)
            parsed.append((item["transaction_id"], offset, item["action"]))
        task = asyncio.ensure_future(self._act_locked(parsed))
        return await asyncio.shield(task)

    async def _act_locked(self, items: list[tuple[str, int, str]]) -> list[dict[str, Any]]:
        tx = self.tx
        taken = await tx.locks.acquire(t for t, _, _ in items)
        try:
            if self.guard is not None:
                # NOT_PRIMARY, even when every answer would be "ended" or "superseded" with
                # nothing to write: a replica's table is its own old term's (or a load of a
                # lagging copy); answered here, the checker moved past the newest copy of a
                # transaction for good (found by the faults suite: the checker follows the
                # nameservers, which learn of a failover seconds late)
                self.guard.require_writable()
            self._require_held(items)
            return await self._act(items)
        finally:
            tx.locks.release(taken)

    def _require_held(self, items: list[tuple[str, int, str]]) -> None:
        """NOT_ENOUGH_REPLICAS for a copy above this primary's high-water mark (the checker
        read its page from another copy, e.g. the deposed primary, just before a failover):
        what this broker knows of it is not settled yet, and "not found" or "superseded" would
        make the checker pass it for good. Decided once a quorum holds it."""
        limit = self.store.visible_offset
        above = [offset for _, offset, _ in items if limit is not None and offset >= limit]
        if above:
            raise ProtocolError(ErrorCode.NOT_ENOUGH_REPLICAS,
                                f"the half copy at {above[0]} is above this primary's "
                                f"high-water mark {limit}: not yet held by a quorum of the "
                                "group's copies; decide it again later")

    async def _act(self, items: list[tuple[str, int, str]]) -> list[dict[str, Any]]:
        tx, now = self.tx, now_ms()
        results: list[dict[str, Any]] = []
        records: list[MessageRecord] = []
        copies: list[tuple[int, TxInfo, int, str]] = []  # (record index, info, check times, action)
        ops: list[OpEntry] = []
        done: set[str] = set()
        for txid, offset, action in items:
            info = tx.table.ensure(txid)
            if info is None:
                results.append({"transaction_id": txid, "outcome": "not_found"})
                continue
            if info.state.ended:
                results.append({"transaction_id": txid, "outcome": "ended"})
                continue
            if offset != info.latest_offset or txid in done:
                results.append({"transaction_id": txid, "outcome": "superseded"})
                continue
            try:
                half = tx.half_of(info)
            except ProtocolError:
                results.append({"transaction_id": txid, "outcome": "not_found"})
                continue
            done.add(txid)
            if action == "discard":
                copies.append((len(records), info, info.check_times, action))
                records.append(discard_copy(half))
                records.append(event_record(EventKind.DISCARD, EventSource.CHECK, info, now))
                ops.append((txid, TxAction.DISCARD.value, EventSource.CHECK.value))
            else:
                times = info.check_times + (1 if action == "check" else 0)
                copies.append((len(records), info, times, action))
                records.append(half_copy(half, times))
                if action == "check":
                    shown = dataclasses.replace(info, check_times=times)
                    records.append(event_record(EventKind.CHECK, EventSource.CHECK, shown, now))
            results.append({"transaction_id": txid, "outcome": _OUTCOME[action]})
        if not records:
            return results
        records.extend(op_records(ops, now))
        try:
            appended = await self.ingest.write(records)
        except BaseException:
            for _, info, _, _ in copies:
                tx.forget(info.txid)
            raise
        live = {}
        for i, info, times, action in copies:
            if action == "discard":
                tx.ended(info, TxState.DISCARDED)
                continue
            where = appended[i]
            info.latest_offset, info.latest_size, info.check_times = (
                where.physical_offset, where.size, times)
            if action == "check":
                qid = int(records[i].properties.get(REAL_QID, "0") or 0)
                tx.channel.offer(info.group, CheckTicket(
                    info.txid, info.message_id, info.topic, qid, times, where.physical_offset,
                    where.size, tx.channel.clock()))
                if info.group not in live:
                    live[info.group] = bool(tx.producers.live(info.group))
        for r in results:
            info = tx.table.get(r["transaction_id"])
            if info is not None:
                r["check_times"] = info.check_times
                if r["outcome"] == "checked":
                    r["producer_alive"] = live.get(info.group, False)
        tx.count(records)
        return results

    # --- after a restart -----------------------------------------------------------------------

    def start_rebuild(self) -> None:
        self._rebuild = asyncio.create_task(self._rebuild_pending(), name="tx-rebuild")

    async def rebuild_again(self) -> None:
        """After ``TransactionService.reload`` (a promotion): find the pending ones again."""
        await self.stop()
        self.rebuilt.clear()
        self.start_rebuild()

    async def stop(self) -> None:
        if self._rebuild is not None and not self._rebuild.done():
            self._rebuild.cancel()
            try:
                await self._rebuild
            except (asyncio.CancelledError, Exception):
                pass

    async def _rebuild_pending(self) -> None:
        """Load every transaction with a half copy past the checker's floor (they were
        pending when the broker stopped, or ended: ``ensure`` tells which)."""
        try:
            end = self.store.log.write_offset  # what this run writes is tracked already
            offset = self._first_offset_at(self.store.floors.get(CHECKER_FLOOR, 0))
            while True:
                res = self.store.get(HALF_TOPIC, 0, offset, REBUILD_PAGE)
                for rec in res.records:
                    if rec.physical_offset >= end:
                        return
                    txid = rec.properties.get(TRANSACTION_ID)
                    if txid and self.tx.table.get(txid) is None:
                        self.tx.table.ensure(txid)
                        self.rebuilt_count += 1
                if not res.records:
                    return
                offset = res.next_offset
                await asyncio.sleep(0)
        finally:
            self.rebuilt.set()
            if self.rebuilt_count:
                log.info("transactions: %d loaded from the half queue after start, %d pending",
                         self.rebuilt_count, len(self.tx.table))

    def _first_offset_at(self, physical: int) -> int:
        """The first half queue offset whose record is at or after ``physical``."""
        lo, hi = self.store.queue_offsets(HALF_TOPIC, 0)
        while lo < hi:
            mid = (lo + hi) // 2
            found = self.store.get(HALF_TOPIC, 0, mid, 1).records
            if found and found[0].physical_offset < physical:
                lo = mid + 1
            else:
                hi = mid
        return lo

    async def pending(self, group: str | None, max_count: int) -> list[dict[str, Any]]:
        with contextlib.suppress(TimeoutError):  # a huge rebuild: answer what is known
            await asyncio.wait_for(self.rebuilt.wait(), REBUILD_WAIT_S)
        return self.tx.pending(group, max_count)

    # --- GET /v1/messages/{id} -----------------------------------------------------------------

    def message_view(self, copies: list[StoredRecord]
                     ) -> tuple[StoredRecord, MessageState] | None:
        """``states.transaction_view`` against this broker's transaction table."""
        return transaction_view(copies, self.tx.table.ensure)


_OUTCOME = {"check": "checked", "defer": "deferred", "discard": "discarded"}
_ACTIONS_FIELDS = frozenset({"actions"})
_ACTION_FIELDS = frozenset({"transaction_id", "physical_offset", "action"})
