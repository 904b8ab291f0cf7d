"""The delay-level walk: each level queue of ``SCHEDULE_TOPIC_XXXX`` in order, due records out.

One request asks the broker for the due records of every level (the delivery time is the
consume queue's tag slot). Per level with due records:

1. the batch's end offset is saved as the level's intent in Redis;
2. the records (minus cancelled ones) are delivered — strict when a crash left an intent
   covering them, or after a failed request;
3. the level's offset moves to the batch's end and the intent is cleared, in one transaction.

Cancels of level messages are kept in Redis (and memory) until the walk passes them; the walk
then remembers the ones it skipped (memory, the last ``PASSED_CANCELS_MAX``), so that a cancel
asked again — its first answer lost, e.g. the broker failed to record it — answers "already
cancelled", not "delivered". A cancel and a delivery of the same message are decided on this
event loop with no await between the check and the change, so exactly one of them wins.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from typing import Any

import msgpack

from tidemq_server.common.broker_client import BrokerClient, BrokerDown, BrokerError, deliver_body
from tidemq_server.common.loop import cancel_tasks
from tidemq_server.scheduler.clock import Clock
from tidemq_server.scheduler.metrics import SchedulerMetrics
from tidemq_server.scheduler.progress import Progress

log = logging.getLogger(__name__)

MAX_PER_LEVEL = 1024
RETRY_S = 0.5
# cancelled level messages the walk skipped, remembered for a repeated cancel (entries; the
# oldest forgotten first: a cancel repeated that much later answers "delivered")
PASSED_CANCELS_MAX = 100_000


class LevelWalker:
    def __init__(self, broker: BrokerClient, progress: Progress, clock: Clock,
                 metrics: SchedulerMetrics, levels_ms: list[int], poll_ms: int) -> None:
        self.broker = broker
        self.progress = progress
        self.clock = clock
        self.metrics = metrics
        self.levels_ms = levels_ms
        self.poll_ms = poll_ms
        self.offsets: dict[int, int] = {}
        self.intents: dict[int, int] = {}  # level → end of a batch that may be stored already
        self.cancelled: dict[tuple[int, int], tuple[int, str]] = {}  # (level, offset) → (due, id)
        # cancelled ones the walk skipped: (level, offset) → id
        self.passed: OrderedDict[tuple[int, int], str] = OrderedDict()
        self.sending: dict[int, tuple[int, int, asyncio.Event]] = {}  # level → (start, end, done)
        self.max_offsets: dict[int, int] = {}
        self.next_due: dict[int, int | None] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    async def start(self) -> None:
        _, self.offsets, self.intents = await self.progress.load()
        self.cancelled = await self.progress.load_cancels()
        if self.intents:
            log.info("levels: re-checking in-flight batches left by the last run: %s",
                     self.intents)
        self._task = asyncio.create_task(self._run(), name="levels")

    async def stop(self) -> None:
        await cancel_tasks(self._task)
        self._task = None

    async def _run(self) -> None:
        while True:
            try:
                wait_ms = await self.run_once()
            except asyncio.CancelledError:
                raise
            except BrokerError as exc:
                log.warning("levels: %s; retrying in %.1fs", exc, RETRY_S)
                wait_ms = int(RETRY_S * 1000)
            except Exception:
                log.exception("levels: walk failed; retrying")
                wait_ms = 1000
            if wait_ms > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait_ms / 1000)
            self._wake.clear()

    async def run_once(self) -> int:
        """Deliver what is due on every level; the time to wait before the next look (ms)."""
        now = self.clock.now_ms()
        answer = await self.broker.levels_due(self.offsets, now, MAX_PER_LEVEL)
        more = False
        for key, level in answer["levels"].items():
            qid = int(key)
            hi = int(level["max_offset"])
            self.max_offsets[qid] = hi
            self.next_due[qid] = level.get("next_due_ms")
            if self.offsets.get(qid, 0) > hi:
                await self._reset(qid, hi)
            start = max(self.offsets.get(qid, 0), int(level["min_offset"]))
            end = int(level["next_offset"])
            if end > start:
                await self._deliver(qid, start, end, level["records"])
                more = more or len(level["records"]) >= MAX_PER_LEVEL
        if more:
            return 0
        dues = [d for d in self.next_due.values() if d is not None]
        soonest = min(dues, default=None)
        wait = self.poll_ms if soonest is None else min(self.poll_ms, soonest - self.clock.now_ms())
        return max(0, wait)

    async def _reset(self, qid: int, end: int) -> None:
        """The level's queue ends below the saved progress: the broker's store is new (its data
        directory was replaced while Redis kept the last run's offsets) or was cut back. Its
        next record gets the queue offset ``end``; the walk starts there (not from the old
        offset, which the queue may take minutes to reach again: every message before that
        would wait), and cancels and intents past it belong to records that are gone."""
        log.warning("levels: level %d's queue ends at offset %d, below the saved progress %d "
                    "(a new or cut-back broker store): walking it from %d", qid + 1, end,
                    self.offsets.get(qid, 0), end)
        for k in [k for k in self.passed if k[0] == qid and k[1] >= end]:
            del self.passed[k]  # those offsets will hold other messages
        stale = [k for k in self.cancelled if k[0] == qid and k[1] >= end]
        for k in stale:
            del self.cancelled[k]
        await self.progress.drop_cancels(stale)
        await self.progress.end_level(qid, end)
        self.offsets[qid] = end
        self.intents.pop(qid, None)

    async def _deliver(self, qid: int, start: int, end: int,
                       records: list[dict[str, Any]]) -> None:
        done = asyncio.Event()
        self.sending[qid] = (start, end, done)
        try:
            batch = [r for r in records if (qid, r["offset"]) not in self.cancelled]
            uncertain = self.intents.get(qid, -1) > start
            if batch:
                await self.progress.begin_level(qid, end)
                await self._send(batch, strict=uncertain)
                now = self.clock.now_ms()
                self.metrics.delivered(len(batch), [now - int(r["due_ms"]) for r in batch],
                                       "level")
            await self.progress.end_level(qid, end)
            self.offsets[qid] = end
            self.intents.pop(qid, None)
            passed = [k for k in self.cancelled if k[0] == qid and k[1] < end]
            for k in passed:
                self.passed[k] = self.cancelled.pop(k)[1]
            while len(self.passed) > PASSED_CANCELS_MAX:
                self.passed.popitem(last=False)
            await self.progress.drop_cancels(passed)
        finally:
            del self.sending[qid]
            done.set()

    async def _send(self, batch: list[dict[str, Any]], strict: bool) -> None:
        payloads = [msgpack.packb(r["record"], use_bin_type=True) for r in batch]
        while True:
            try:
                await self.broker.deliver(deliver_body(
                    payloads, list(range(len(payloads))) if strict else []))
                return
            except BrokerError as exc:
                log.warning("levels: delivering %d message(s) failed (%s); retrying",
                            len(payloads), exc)
                self.metrics.delivery_failures.inc()
                strict = strict or not isinstance(exc, BrokerDown) or exc.maybe_done
                await asyncio.sleep(RETRY_S)

    # --- cancel ----------------------------------------------------------------------------
    async def cancel(self, level: int, offset: int, due: int, message_id: str) -> str:
        """"cancelled", "already_cancelled" or "delivered" (a cancel of a level message)."""
        qid = level - 1
        while True:
            if (qid, offset) in self.cancelled:
                return "already_cancelled"
            sending = self.sending.get(qid)
            if sending is not None and sending[0] <= offset < sending[1]:
                await sending[2].wait()  # in a delivery in flight: it will be delivered
                continue
            if offset < self.offsets.get(qid, 0):
                # skipped as cancelled (a repeated cancel: the first answer was lost), or
                # delivered
                skipped = self.passed.get((qid, offset)) == message_id
                return "already_cancelled" if skipped else "delivered"
            self.cancelled[(qid, offset)] = (due, message_id)
            await self.progress.add_cancel(qid, offset, due, message_id)
            self.metrics.cancelled.labels("level").inc()
            return "cancelled"

    def pending(self) -> dict[int, int]:
        """Pending messages per level (1-based), cancelled ones left out."""
        out = {}
        for qid in range(len(self.levels_ms)):
            waiting = max(0, self.max_offsets.get(qid, 0) - self.offsets.get(qid, 0))
            waiting -= sum(1 for q, o in self.cancelled if q == qid
                           and o >= self.offsets.get(qid, 0))
            out[qid + 1] = max(0, waiting)
        return out
