"""Delayed messages: cancel and inspect (public), and the scheduler's internal endpoints."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, StrictInt
from tidemq.protocol import ErrorCode, ProtocolError
from tidemq.protocol.numbers import INT64_MAX

from tidemq_server.broker.delays.service import MAX_DUE_PER_LEVEL, MAX_INTAKE
from tidemq_server.broker.routes._common import (
    StrictBody,
    WaitMs,
    body_doc,
    broker_of,
    internal_auth,
    read_model,
    read_payload,
)
from tidemq_server.broker.routes.answers import Cancelled
from tidemq_server.broker.routes.answers_internal import (
    Delivered,
    Floor,
    Intake,
    LevelsDue,
    Pending,
    ScheduleInfo,
    TimerCancels,
)
from tidemq_server.broker.routes.raw_ids import path_id
from tidemq_server.common.answers import Scheduled
from tidemq_server.common.app import reply
from tidemq_server.common.openapi import errors

router = APIRouter(tags=["delayed messages"])


@router.delete("/v1/messages/{message_id}/schedule",
               summary="Cancel a delayed message that was not delivered yet",
               response_model=Cancelled, responses=errors(
                   ErrorCode.INVALID_TOPIC_NAME, ErrorCode.MESSAGE_NOT_FOUND,
                   ErrorCode.ALREADY_DELIVERED, ErrorCode.AMBIGUOUS_MESSAGE_ID,
                   ErrorCode.UNAVAILABLE))
async def cancel(
    message_id: str, request: Request,
    topic: Annotated[str | None, Query(
        description="the topic it was sent to (ids are unique per topic only); without it, "
                    "an id delayed in several topics is refused with 409 "
                    "AMBIGUOUS_MESSAGE_ID")] = None,
) -> Response:
    answer = await broker_of(request).delays.cancel(path_id(message_id), topic)
    return reply(request, answer)


@router.get("/v1/scheduled", summary="Pending delayed messages: count, next due time, by level",
            response_model=Scheduled,
            responses=errors(ErrorCode.INVALID_TOPIC_NAME, ErrorCode.UNAVAILABLE))
async def scheduled(request: Request,
                    topic: Annotated[str | None, Query(description="only this topic")] = None,
                    ) -> Response:
    return reply(request, await broker_of(request).delays.pending_delays(topic))


# --- for the scheduler ---------------------------------------------------------------------------

internal = APIRouter(prefix="/internal/v1/schedule", tags=["internal"],
                     dependencies=[Depends(internal_auth)])


class DueBody(StrictBody):
    offsets: dict[int, StrictInt] = Field(default_factory=dict,
                                          description="level queue id → next offset")
    now_ms: StrictInt = Field(description="the scheduler's clock: due means tag slot ≤ this")
    max: int = Field(1024, ge=1, le=MAX_DUE_PER_LEVEL, description="records per level at most")


class ProgressBody(StrictBody):
    owner: str = Field(min_length=1, max_length=255)
    positions: list[tuple[str, StrictInt, StrictInt]] = Field(
        description="[topic, queue id, next offset] of every queue the owner consumes")


class PendingBody(StrictBody):
    offsets: dict[int, StrictInt] = Field(default_factory=dict,
                                          description="level queue id → next offset")
    intake_offset: StrictInt = Field(0, ge=0, description="next intake offset not taken in")
    topic: str | None = None
    skip: list[tuple[StrictInt, StrictInt]] = Field(default_factory=list,
                                                    description="[queue id, offset] cancelled")


class DeliverDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")

    records: list[list[Any]] = Field(description="delivery rows: [topic, queue_id, body, "
                                     "properties, flag, sys_flag, born_timestamp_ms, "
                                     "born_host, reconsume_times, prepared_tx_offset]; body "
                                     "as raw bytes (msgpack) or base64 text (JSON)")
    strict: list[int] = Field(default_factory=list,
                              description="indexes to store only if not delivered already")


@internal.get("/info", summary="Delay table and identity of this broker",
              response_model=ScheduleInfo)
async def info(request: Request) -> Response:
    return reply(request, broker_of(request).delays.info())


@internal.get("/intake", summary="Timers of the intake topic, ready to file",
              response_model=Intake)
async def intake(
    request: Request,
    offset: Annotated[int, Query(ge=0, le=INT64_MAX)] = 0,
    max: Annotated[int, Query(ge=1, le=MAX_INTAKE)] = 1024,
    wait_ms: WaitMs = 0,
) -> Response:
    return reply(request, await broker_of(request).delays.intake(offset, max, wait_ms))


@internal.get("/cancels", summary="Ids of cancelled delayed messages, for a scheduler rebuild",
              response_model=TimerCancels)
async def cancels(
    request: Request,
    offset: Annotated[int, Query(ge=0, le=INT64_MAX)] = 0,
    max: Annotated[int, Query(ge=1, le=MAX_INTAKE)] = 1024,
) -> Response:
    return reply(request, broker_of(request).delays.cancels(offset, max))


@internal.post("/levels/due", openapi_extra=body_doc(DueBody),
               summary="Due records of every delay-level queue, in queue order",
               response_model=LevelsDue)
async def levels_due(request: Request) -> Response:
    body = await read_model(request, DueBody)
    answer = broker_of(request).delays.levels_due(body.offsets, body.now_ms, body.max)
    return reply(request, answer)


@internal.post("/deliver", openapi_extra=body_doc(DeliverDoc),
               summary="Store due messages in their real topics (one store write)",
               response_model=Delivered, responses=errors(
                   ErrorCode.INVALID_TOPIC_NAME, ErrorCode.BROKER_BUSY, ErrorCode.DISK_FULL))
async def deliver(request: Request) -> Response:
    broker = broker_of(request)
    payload = await read_payload(request, broker.sender.max_request_bytes)
    return reply(request, await broker.delays.deliver(payload))


@internal.post("/progress", openapi_extra=body_doc(ProgressBody),
               summary="The scheduler's offsets: its retention floor", response_model=Floor)
async def progress(request: Request) -> Response:
    body = await read_model(request, ProgressBody)
    floor = broker_of(request).delays.report_progress(body.owner, body.positions)
    return reply(request, {"floor": floor})


@internal.post("/pending", openapi_extra=body_doc(PendingBody),
               summary="Count what waits beyond the scheduler's offsets (of one topic)",
               response_model=Pending)
async def pending(request: Request) -> Response:
    body = await read_model(request, PendingBody)
    if body.topic is not None and not body.topic:
        raise ProtocolError(ErrorCode.BAD_REQUEST, "topic must not be empty")
    answer = broker_of(request).delays.pending(body.offsets, body.intake_offset, body.topic,
                                                 {(q, o) for q, o in body.skip})
    return reply(request, answer)
