"""The scheduler's FastAPI app: /healthz, /metrics and the internal API the broker asks.

Every ``/internal/`` endpoint needs the cluster token. Cancel answers
``{state: "cancelled"}`` (also when it was cancelled before), 409 ALREADY_DELIVERED, 404
MESSAGE_NOT_FOUND, or 503 UNAVAILABLE while a delivery of it is in flight and undecided.
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from pydantic import BaseModel, Field, StrictInt
from tidemq.protocol import ErrorCode, ProtocolError

from services.common.app import create_app, require_token
from services.scheduler.cancel import Outcome
from services.scheduler.metrics import SchedulerMetrics
from services.scheduler.service import Scheduler
from services.scheduler.settings import SchedulerSettings

GC_THRESHOLDS = (700, 10, 10)  # gen 0 / 1 / 2 collection thresholds: Python's defaults


class CancelBody(BaseModel):
    message_id: str = Field(min_length=1, max_length=255)
    due_ms: StrictInt | None = Field(None, description="due time, when the broker knows it")
    topic: str | None = None
    level: StrictInt | None = Field(None, ge=1, description="a delay-level message: its level")
    queue_offset: StrictInt | None = Field(None, ge=0, description="... and its queue offset")
    intake_offset: StrictInt | None = Field(None, ge=0,
                                            description="a timer: its intake queue offset")


class ClockBody(BaseModel):
    advance_ms: StrictInt = Field(ge=0)


def scheduler_of(request: Request) -> Scheduler:
    scheduler: Scheduler = request.app.state.scheduler
    return scheduler


def _token(request: Request) -> None:
    require_token(request, scheduler_of(request).settings.token)


router = APIRouter(prefix="/internal/v1", tags=["internal"], dependencies=[Depends(_token)])


@router.post("/timers/cancel", summary="Cancel a delayed message not delivered yet")
async def cancel(body: CancelBody, request: Request) -> dict[str, Any]:
    scheduler = scheduler_of(request)
    scheduler.require_ready()
    outcome = await scheduler.canceller.cancel(
        body.message_id, due_ms=body.due_ms, level=body.level, queue_offset=body.queue_offset,
        intake_offset=body.intake_offset)
    if outcome in (Outcome.CANCELLED, Outcome.ALREADY_CANCELLED):
        return {"message_id": body.message_id, "state": "cancelled"}
    if outcome is Outcome.DELIVERED:
        raise ProtocolError(ErrorCode.ALREADY_DELIVERED,
                            f"message {body.message_id!r} was already delivered: too late to "
                            "cancel")
    if outcome is Outcome.BUSY:
        raise ProtocolError(ErrorCode.UNAVAILABLE,
                            f"message {body.message_id!r} is being delivered right now; ask "
                            "again to learn the outcome")
    raise ProtocolError(ErrorCode.MESSAGE_NOT_FOUND,
                        f"no pending delayed message {body.message_id!r} on this scheduler")


@router.get("/scheduled", summary="Pending delayed messages: count, next due time, by level")
async def scheduled(request: Request,
                    topic: Annotated[str | None, Query()] = None) -> dict[str, Any]:
    return await scheduler_of(request).scheduled(topic)


@router.get("/status", summary="Clock, progress and memory (for operators and tests)")
async def status(request: Request) -> dict[str, Any]:
    s = scheduler_of(request)
    return {"ready": s.ready, "now_ms": s.clock.now_ms(), "clock_offset_ms": s.clock.offset_ms,
            "ingested_next": s.store.ingested_next, "pending_timers": s.store.pending,
            "near_timers": s.store.wheel.count, "loaded_buckets": sorted(s.store.loaded),
            "level_offsets": s.levels.offsets if s.ready else {},
            "gauges": s.gauges()}


@router.post("/clock", summary="Move the scheduler's clock forward (test_clock only)")
async def advance_clock(body: ClockBody, request: Request) -> dict[str, Any]:
    s = scheduler_of(request)
    if not s.settings.test_clock:
        raise ProtocolError(ErrorCode.BAD_REQUEST,
                            "the clock can be moved only with TIDEMQ_SCHEDULER_TEST_CLOCK=true")
    s.clock.advance(body.advance_ms)
    s.deliverer.wakeup()
    return {"now_ms": s.clock.now_ms(), "clock_offset_ms": s.clock.offset_ms}


def create_scheduler_app(settings: SchedulerSettings | None = None) -> FastAPI:
    settings = settings if settings is not None else SchedulerSettings()
    metrics = SchedulerMetrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        logging.getLogger("httpx").setLevel(logging.WARNING)  # not one line per request
        # services.common.runner raises the collector's thresholds for request-heavy
        # services. The scheduler's heap is small, and every httpx response it gets (up to
        # ~1 MB of timers) sits in a reference cycle: with raised thresholds those bodies pile
        # up by the hundred MB before a collection. Python's defaults free them at once.
        gc.set_threshold(*GC_THRESHOLDS)
        scheduler = Scheduler(settings, metrics)
        await scheduler.start()
        app.state.scheduler = scheduler
        try:
            yield
        finally:
            await scheduler.stop()

    app = create_app("tidemq scheduler", metrics.registry, lifespan)
    app.include_router(router)
    return app
