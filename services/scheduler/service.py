"""One scheduler: every part, opened in dependency order and closed in reverse.

The timer store recovers from disk first and delivery starts at once; the parts that need the
broker (its name and delay table) and Redis (progress) start when both answer, retrying until
then. Until that point cancel and inspection answer 503 UNAVAILABLE. A store found empty is
rebuilt from the broker's intake topic first (services/scheduler/rebuild.py); the roller keeps
the rebuild floor and rolls long timers (services/scheduler/rolls.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any

import psutil
from tidemq.protocol import ErrorCode, ProtocolError, SystemTopic

from tidemq_server.common.broker_client import BrokerClient
from tidemq_server.common.constants import SCHEDULER_FLOOR_OWNER
from tidemq_server.common.loop import Periodic, cancel_tasks
from tidemq_server.scheduler.cancel import Canceller
from tidemq_server.scheduler.clock import Clock
from tidemq_server.scheduler.delivery import Deliverer
from tidemq_server.scheduler.intake import IntakeLoop
from tidemq_server.scheduler.levels import LevelWalker
from tidemq_server.scheduler.lookup import first_far_due, pending_of_topic
from tidemq_server.scheduler.metrics import SchedulerMetrics
from tidemq_server.scheduler.progress import Progress
from tidemq_server.scheduler.rebuild import prepare
from tidemq_server.scheduler.rolls import Roller
from tidemq_server.scheduler.settings import SchedulerSettings
from tidemq_server.scheduler.timers import TimerConfig, TimerStore

log = logging.getLogger(__name__)

# waiting for the broker and Redis at start (s): the first retry soon, then doubling up to the
# longest wait. Short: a scheduler started beside its broker must find it as soon as it answers
# (a delay sent meanwhile waits for that), and a failed try costs one refused connection (the
# nameservers are asked at most every DISCOVERY_RETRY_S)
CONNECT_RETRY_FIRST_S = 0.05
CONNECT_RETRY_S = 0.25


class Scheduler:
    progress: Progress
    levels: LevelWalker
    intake: IntakeLoop
    canceller: Canceller

    def __init__(self, settings: SchedulerSettings, metrics: SchedulerMetrics | None = None
                 ) -> None:
        s = settings
        self.settings = s
        self.metrics = metrics if metrics is not None else SchedulerMetrics()
        self.clock = Clock(s.clock_offset_ms)
        self.store = TimerStore(s.data_dir, TimerConfig(s.bucket_ms, s.preload_ms, s.tick_ms,
                                                        s.segment_bytes), self.clock)
        resolver = s.resolver()
        self.broker = BrokerClient(s.broker_url, s.token, s.broker_timeout_s,
                                   user_agent="tidemq-scheduler",
                                   resolver=resolver if resolver.discovered else None)
        self.deliverer = Deliverer(self.store, self.broker, self.clock, self.metrics,
                                   s.deliver_batch, s.deliver_parallelism)
        self.roller = Roller(self.store, self.broker, self.metrics, s.roll_after_ms,
                             s.roll_batch)
        self.rebuild_floor: int | None = None  # saved in Redis: what the broker must keep
        self.broker_name = ""
        self.levels_ms: list[int] = []
        self.ready = False
        self._tasks: list[asyncio.Task[None]] = []
        self._checkpoints = Periodic("checkpoints", s.checkpoint_interval_ms / 1000,
                                     self.store.checkpoint, pause_first=True)
        self._rolls = Periodic("rolls", s.roll_interval_ms / 1000, self.roll_pass)
        self._floor_reports = Periodic("floor", s.progress_interval_ms / 1000, self.report_floor)
        self._process = psutil.Process(os.getpid())

    async def start(self) -> None:
        await asyncio.to_thread(self.store.recover)
        self.deliverer.start()
        self._checkpoints.start()
        self._tasks.append(asyncio.create_task(self._connect(), name="connect"))
        self.metrics.add_gauges(self.gauges)

    async def _connect(self) -> None:
        s = self.settings
        warned = False
        retry_s = CONNECT_RETRY_FIRST_S
        while True:
            progress: Progress | None = None
            try:
                info = await self.broker.schedule_info()
                self.broker_name = str(info["broker_name"])
                if s.broker_name and self.broker_name != s.broker_name:
                    if self.broker.resolver is not None:
                        self.broker.resolver.invalidate()
                    raise ValueError(f"the broker at {self.broker.base_url} is "
                                     f"{self.broker_name!r}, not {s.broker_name!r}")
                self.levels_ms = [int(x) for x in info["delay_levels_ms"]]
                progress = Progress(s.redis_url, s.cluster, self.broker_name)
                intake_offset, _, _ = await progress.load()
                saved_floor = await progress.rebuild_floor()
                rebuild_from = await prepare(self.store, self.broker, self.metrics, saved_floor)
                self.progress = progress
                break
            except BaseException as exc:
                if progress is not None:  # a new client per try: this one's pool goes
                    with contextlib.suppress(Exception):
                        await progress.close()
                if not isinstance(exc, Exception):  # cancelled: the scheduler stops
                    raise
                if not warned:
                    log.warning("waiting for the broker (%s) and Redis (%s); retrying (at "
                                "least every %gs)", self.broker.describe(), exc,
                                CONNECT_RETRY_S)
                    warned = True
                await asyncio.sleep(retry_s)
                retry_s = min(retry_s * 2, CONNECT_RETRY_S)
        self.levels = LevelWalker(self.broker, self.progress, self.clock, self.metrics,
                                  self.levels_ms, s.level_poll_ms)
        await self.levels.start()
        self.intake = IntakeLoop(self.store, self.broker, self.progress, self.metrics,
                                 s.intake_batch, s.intake_wait_ms, self.deliverer.wakeup)
        self.intake.start(rebuild_from if rebuild_from is not None else intake_offset)
        self.canceller = Canceller(self.store, self.deliverer, self.levels, self.metrics)
        self._rolls.start()
        self.ready = True
        log.info("scheduler serving broker %s at %s: %d delay levels, intake from offset %d, "
                 "%d pending timer(s)", self.broker_name, self.broker.base_url,
                 len(self.levels_ms), self.intake.offset, self.store.pending)

    async def roll_pass(self) -> None:
        """Roll long timers and save the rebuild floor in Redis (every ``roll_interval_ms``, the
        first at once); the broker's retention floor follows the saved value only, reported
        from the first saved floor on."""
        try:
            floor = await self.roller.run_once()
            await self.progress.set_rebuild_floor(floor)
            if self.rebuild_floor is None:
                self._floor_reports.start()
            self.rebuild_floor = floor
        except Exception as exc:
            log.warning("the roll pass failed (%r); retrying in %.1fs", exc,
                        self._rolls.interval_s)

    async def report_floor(self) -> None:
        """Tell the broker what it must keep: intake records from the rebuild floor (saved in
        Redis first) and level records not delivered yet. Sent every interval, changed or not:
        the broker turns "consumed to the end" into the log's current end, so an idle scheduler
        does not hold old segments either."""
        floor = self.rebuild_floor or 0
        positions = [(SystemTopic.TIMER_INTAKE.value, 0, floor)]
        positions += [(SystemTopic.SCHEDULE.value, q, self.levels.offsets.get(q, 0))
                      for q in range(len(self.levels_ms))]
        try:
            await self.broker.schedule_progress(SCHEDULER_FLOOR_OWNER, positions)
        except Exception as exc:
            log.warning("reporting progress to the broker failed: %s", exc)

    async def stop(self) -> None:
        self.ready = False
        await self._checkpoints.stop()
        await cancel_tasks(*self._tasks)  # the connect step: it starts the roll loop
        await self._rolls.stop()  # before the floor reports: a roll pass starts those
        await self._floor_reports.stop()
        steps: list[tuple[str, Any]] = []
        if hasattr(self, "intake"):
            steps.append(("intake", self.intake.stop()))
        if hasattr(self, "levels"):
            steps.append(("level walk", self.levels.stop()))
        steps.append(("delivery", self.deliverer.stop()))
        steps.append(("checkpoint", self.store.checkpoint()))
        if hasattr(self, "progress"):
            steps.append(("redis", self.progress.close()))
        steps.append(("broker client", self.broker.close()))
        for name, step in steps:
            try:
                await step
            except Exception:
                log.exception("stopping the %s failed", name)
        self.store.close()
        log.info("scheduler stopped")

    # --- answers ------------------------------------------------------------------------------
    def require_ready(self) -> None:
        if not self.ready:
            raise ProtocolError(ErrorCode.UNAVAILABLE,
                                "the scheduler is starting (waiting for the broker and Redis); "
                                "retry shortly")

    async def scheduled(self, topic: str | None) -> dict[str, Any]:
        """``{pending, next_due_ms, by_level, timers}`` (docs/api.md ``GET /v1/scheduled``): level
        messages and timers not taken in yet are counted by the broker from its queues, the
        timers taken in by the timer store."""
        self.require_ready()
        levels, store = self.levels, self.store
        taken_in = store.pending  # with the intake position, at one instant
        waiting = await self.broker.pending(levels.offsets, store.ingested_next, topic,
                                            list(levels.cancelled))
        by_level = {int(q) + 1: int(n) for q, n in waiting["by_queue"].items()}
        early = sum(1 for o in store.precancels.by_id.values() if o >= store.ingested_next)
        dues = [waiting.get("next_due_ms"), waiting.get("intake_next_due_ms")]
        if topic:
            timers, timer_due = await pending_of_topic(store, topic)
            dues.append(timer_due)
        else:
            timers = taken_in
            near = [store.wheel.next_due(), self.deliverer.queued_due()]
            dues += near
            if timers and all(d is None for d in near):
                dues.append(await first_far_due(store))
        timers += max(0, int(waiting["intake_pending"]) - (0 if topic else early))
        known = [d for d in dues if d is not None]
        return {"pending": timers + sum(by_level.values()),
                "next_due_ms": min(known) if known else None,
                "by_level": {str(q): by_level.get(q, 0) for q in range(1, len(self.levels_ms) + 1)},
                "timers": timers}

    def gauges(self) -> dict[str, float]:
        ready = self.ready
        return {
            "pending_timers": float(self.store.pending),
            "pending_level_messages": float(sum(self.levels.pending().values()) if ready else 0),
            "near_timers": float(self.store.wheel.count),
            "queued_timers": float(self.deliverer.queued),
            "in_flight_timers": float(len(self.deliverer.sending)),
            "loaded_buckets": float(len(self.store.loaded)),
            "buckets": float(len(self.store.buckets.sizes)),
            "disk_bytes": float(self.store.disk_bytes()),
            "ingested_offset": float(self.store.ingested_next),
            "rebuild_floor": float(self.rebuild_floor or 0),
            "rebuilding": float(self.store.rebuilding),
            "intake_lag": float(self.intake.lag if ready else 0),
            "max_lateness_ms": float(self.metrics.max_lateness_ms),
            "clock_offset_ms": float(self.clock.offset_ms),
            "resident_bytes": float(self._process.memory_info().rss),
        }
