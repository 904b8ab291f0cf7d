"""Intake: arbitrary-delay timers from the broker's ``TIDE_SYS_TIMER_INTAKE`` topic into the
timer store, in batches, with the next pull in flight while a batch is being written.

Order of durability: a batch is in the timer log (fdatasync) before the Redis progress moves
and before the broker is told it may drop those records (the retention floor). A timer taken
in twice (a crash between the two) is recognised by its intake offset and kept once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from tidemq.protocol import IntakeRow

from tidemq_server.common.broker_client import BrokerClient, BrokerError
from tidemq_server.common.loop import cancel_tasks
from tidemq_server.scheduler.metrics import SchedulerMetrics
from tidemq_server.scheduler.progress import Progress
from tidemq_server.scheduler.rolls import roll_count
from tidemq_server.scheduler.timers import Timer, TimerStore

log = logging.getLogger(__name__)

RETRY_S = 0.5  # pause after a failed intake pull (s): a failover costs new timers no more


class IntakeLoop:
    def __init__(self, store: TimerStore, broker: BrokerClient, progress: Progress,
                 metrics: SchedulerMetrics, batch: int, wait_ms: int,
                 on_ingested: Any = None) -> None:
        self.store = store
        self.broker = broker
        self.progress = progress
        self.metrics = metrics
        self.batch = batch
        self.wait_ms = wait_ms
        self.on_ingested = on_ingested  # called after a batch is filed (wakes delivery)
        self.offset = 0
        self.lag = 0  # intake records not taken in yet (at the last pull)
        self._task: asyncio.Task[None] | None = None

    def start(self, redis_offset: int) -> None:
        self.offset = max(redis_offset, self.store.ingested_next)
        self._task = asyncio.create_task(self._run(), name="intake")

    async def stop(self) -> None:
        await cancel_tasks(self._task)
        self._task = None

    async def _pull(self, offset: int) -> dict[str, Any]:
        return await self.broker.intake(offset, self.batch, self.wait_ms)

    async def _run(self) -> None:
        pending: asyncio.Task[dict[str, Any]] | None = None
        try:
            while True:
                if pending is None:
                    pending = asyncio.create_task(self._pull(self.offset))
                try:
                    answer = await pending
                except BrokerError as exc:
                    pending = None
                    log.warning("intake: pulling from offset %d failed (%s); retrying in %.1fs",
                                self.offset, exc, RETRY_S)
                    await asyncio.sleep(RETRY_S)
                    continue
                nxt = int(answer["next_offset"])
                timers = answer.get("timers") or []
                if timers and int(timers[0][0]) > self.offset:
                    log.error("intake: records %d-%d are gone from the broker (retention)",
                              self.offset, int(timers[0][0]) - 1)
                self.lag = max(0, int(answer.get("max_offset", nxt)) - nxt)
                pending = asyncio.create_task(self._pull(nxt)) if nxt > self.offset else None
                await self.take(timers, nxt)
        finally:
            if pending is not None:
                pending.cancel()
                with contextlib.suppress(BaseException):
                    await pending

    async def take(self, rows: list[list[Any]], next_offset: int) -> None:
        """File ``IntakeRow``s; then save the progress."""
        timers = []
        for row in rows:
            try:
                t = IntakeRow._make(row)
                record = bytes(t.record)
                timers.append(Timer(int(t.due_ms), int(t.queue_offset), str(t.message_id),
                                    str(t.topic), record, roll_count(record)))
            except (ValueError, TypeError) as exc:
                log.error("intake: a row is not a timer (%r): skipped", exc)
        n = await self.store.ingest(timers, next_offset)
        self.offset = next_offset
        if n:
            self.metrics.ingested.inc(n)
            if self.on_ingested is not None:
                self.on_ingested()
        if rows:
            try:
                await self.progress.set_intake(self.store.ingested_next)
            except Exception as exc:  # the timer log is the truth; Redis catches up later
                log.warning("intake: saving progress to Redis failed: %s", exc)
