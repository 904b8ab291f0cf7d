"""The scheduler's FastAPI app: /healthz, /metrics and the internal API the broker asks.

Every ``/internal/`` endpoint needs the cluster token. Cancel answers
``{state: "cancelled"}`` (also when it was cancelled before), 409 ALREADY_DELIVERED, 409
AMBIGUOUS_MESSAGE_ID (no topic, and the id waits in several), 404 MESSAGE_NOT_FOUND (saying
what was searched), or 503 UNAVAILABLE while it cannot be decided (a delivery of it in flight,
or a rolled copy not taken in after a restart).
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, FastAPI, Query, Request, Response
from pydantic import BaseModel, Field, StrictInt
from tidemq.protocol import ErrorCode, ProtocolError, validate_topic_name
from tidemq.protocol.numbers import INT32_MAX, INT64_MAX

from tidemq_server.common.answers import Histogram, Scheduled
from tidemq_server.common.app import create_app, error_response, reply, token_guard
from tidemq_server.common.auth import service_gate
from tidemq_server.common.bodies import StrictBody, body_doc, read_model
from tidemq_server.common.broker_client import BrokerDown, BrokerRefused
from tidemq_server.common.openapi import errors
from tidemq_server.scheduler.cancel import Outcome
from tidemq_server.scheduler.histogram import histogram
from tidemq_server.scheduler.metrics import SchedulerMetrics
from tidemq_server.scheduler.service import Scheduler
from tidemq_server.scheduler.settings import SchedulerSettings

GC_THRESHOLDS = (700, 10, 10)  # gen 0 / 1 / 2 collection thresholds: Python's defaults
MAX_CLOCK_ADVANCE_MS = 10 * 366 * 24 * 3600 * 1000  # one clock move at most (ms): ten years


class CancelBody(StrictBody):
    message_id: str = Field(min_length=1, max_length=255)
    due_ms: StrictInt | None = Field(None, ge=0, le=INT64_MAX,
                                     description="due time, when the broker knows it")
    topic: str | None = Field(None, description="the real topic: a cancel never touches a "
                              "timer of another topic with the same id; without it, an id "
                              "waiting in several topics is refused (409 AMBIGUOUS_MESSAGE_ID)")
    level: StrictInt | None = Field(None, ge=1, le=INT32_MAX,
                                    description="a delay-level message: its level")
    queue_offset: StrictInt | None = Field(None, ge=0, le=INT64_MAX,
                                           description="... and its queue offset")
    intake_offset: StrictInt | None = Field(None, ge=0, le=INT64_MAX,
                                            description="a timer: its intake queue offset")


class ClockBody(StrictBody):
    advance_ms: StrictInt = Field(ge=0, le=MAX_CLOCK_ADVANCE_MS)


class CancelAnswer(BaseModel):
    message_id: str
    state: str = Field(description='"cancelled" (also when it was cancelled before)')
    topic: str | None = Field(None, description="the topic of the message cancelled, when known")


class StatusAnswer(BaseModel):
    ready: bool
    now_ms: int = Field(description="the scheduler's clock")
    clock_offset_ms: int
    ingested_next: int
    pending_timers: int
    near_timers: int
    loaded_buckets: list[int]
    level_offsets: dict[str, int] = Field(description="level queue id → next offset")
    gauges: dict[str, float]


class ClockAnswer(BaseModel):
    now_ms: int
    clock_offset_ms: int


def refusal_error(exc: BrokerRefused) -> ProtocolError:
    """What the scheduler answers its own caller when the broker refused a request made for it.

    A 4xx about the request's content (the caller's input, passed on) keeps its code; a refusal
    of the scheduler itself (its token: 401/403) or any other status is the scheduler's problem
    and answers 503 UNAVAILABLE. The broker's words are kept either way.
    """
    text = f"the broker refused ({exc.status} {exc.code}): {exc.message}"
    try:
        code = ErrorCode(exc.code)
    except ValueError:
        code = ErrorCode.BAD_REQUEST if exc.status in (400, 422) else ErrorCode.UNAVAILABLE
    if not 400 <= exc.status < 500 or exc.status in (401, 403) or code.http_status >= 500:
        code = ErrorCode.UNAVAILABLE
    return ProtocolError(code, text)


def scheduler_of(request: Request) -> Scheduler:
    scheduler: Scheduler = request.app.state.scheduler
    return scheduler


def _token_of(request: Request) -> str:
    return scheduler_of(request).settings.token


router = APIRouter(prefix="/internal/v1", tags=["internal"],
                   dependencies=[Depends(token_guard(_token_of))])


@router.post("/timers/cancel", summary="Cancel a delayed message not delivered yet",
             openapi_extra=body_doc(CancelBody), response_model=CancelAnswer,
             responses=errors(ErrorCode.MESSAGE_NOT_FOUND, ErrorCode.ALREADY_DELIVERED,
                              ErrorCode.AMBIGUOUS_MESSAGE_ID, ErrorCode.UNAVAILABLE))
async def cancel(request: Request) -> Response:
    body = await read_model(request, CancelBody)
    scheduler = scheduler_of(request)
    scheduler.require_ready()
    levels = len(scheduler.levels_ms)
    if body.topic:
        validate_topic_name(body.topic)  # kept in the pre-cancel file: a name of ≤ 127 chars
    if body.level is not None and body.level > levels:
        raise ProtocolError(ErrorCode.BAD_REQUEST,
                            f"level: must be 1-{levels} (the broker's delay levels), got "
                            f"{body.level}")
    outcome, topic, detail = await scheduler.canceller.cancel(
        body.message_id, topic=body.topic or None, due_ms=body.due_ms, level=body.level,
        queue_offset=body.queue_offset, intake_offset=body.intake_offset)
    if outcome in (Outcome.CANCELLED, Outcome.ALREADY_CANCELLED):
        return reply(request, {"message_id": body.message_id, "state": "cancelled",
                               "topic": topic})
    if outcome is Outcome.DELIVERED:
        raise ProtocolError(ErrorCode.ALREADY_DELIVERED,
                            f"message {body.message_id!r} was already delivered: too late to "
                            "cancel")
    why = f" ({detail})" if detail else ""
    if outcome is Outcome.BUSY:
        raise ProtocolError(ErrorCode.UNAVAILABLE,
                            f"message {body.message_id!r} cannot be decided right now{why}; "
                            "ask again to learn the outcome")
    raise ProtocolError(ErrorCode.MESSAGE_NOT_FOUND,
                        f"no pending delayed message {body.message_id!r} on this scheduler{why}")


@router.get("/scheduled", summary="Pending delayed messages: count, next due time, by level",
            response_model=Scheduled, responses=errors(ErrorCode.UNAVAILABLE))
async def scheduled(request: Request,
                    topic: Annotated[str | None, Query()] = None) -> Response:
    return reply(request, await scheduler_of(request).scheduled(topic))


@router.get("/scheduled/histogram", summary="Pending timers by hour or day of due time",
            response_model=Histogram, responses=errors(ErrorCode.UNAVAILABLE))
async def scheduled_histogram(
    request: Request,
    by: Annotated[Literal["hour", "day"], Query(description="bucket width")] = "hour",
) -> Response:
    scheduler = scheduler_of(request)
    scheduler.require_ready()
    return reply(request, await histogram(scheduler.store, by))


@router.get("/status", summary="Clock, progress and memory (for operators and tests)",
            response_model=StatusAnswer)
async def status(request: Request) -> Response:
    s = scheduler_of(request)
    return reply(request, {
        "ready": s.ready, "now_ms": s.clock.now_ms(), "clock_offset_ms": s.clock.offset_ms,
        "ingested_next": s.store.ingested_next, "pending_timers": s.store.pending,
        "near_timers": s.store.wheel.count, "loaded_buckets": sorted(s.store.loaded),
        "level_offsets": s.levels.offsets if s.ready else {}, "gauges": s.gauges()})


@router.post("/clock", summary="Move the scheduler's clock forward (test_clock only)",
             openapi_extra=body_doc(ClockBody), response_model=ClockAnswer)
async def advance_clock(request: Request) -> Response:
    body = await read_model(request, ClockBody)
    s = scheduler_of(request)
    if not s.settings.test_clock:
        raise ProtocolError(ErrorCode.BAD_REQUEST,
                            "the clock can be moved only with TIDEMQ_SCHEDULER_TEST_CLOCK=true")
    s.clock.advance(body.advance_ms)
    s.deliverer.wakeup()
    return reply(request, {"now_ms": s.clock.now_ms(), "clock_offset_ms": s.clock.offset_ms})


def create_scheduler_app(settings: SchedulerSettings | None = None) -> FastAPI:
    settings = settings if settings is not None else SchedulerSettings()
    metrics = SchedulerMetrics()
    gate = service_gate(settings, metrics.registry)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        logging.getLogger("httpx").setLevel(logging.WARNING)  # not one line per request
        # tidemq_server.common.runner raises the collector's thresholds for request-heavy
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

    app = create_app("tidemq scheduler", metrics.registry, lifespan, gate=gate)
    app.include_router(router)

    @app.exception_handler(BrokerRefused)
    async def _broker_refused(_: Request, exc: BrokerRefused) -> Response:
        err = refusal_error(exc)
        return error_response(err.code, err.message)

    @app.exception_handler(BrokerDown)
    async def _broker_down(_: Request, exc: BrokerDown) -> Response:
        return error_response(ErrorCode.UNAVAILABLE, f"the broker cannot be reached: {exc}")

    return app
