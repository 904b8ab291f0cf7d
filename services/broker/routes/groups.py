"""Consumer groups: membership, offsets, retry, and the simple consumer (receive/ack/invisibility).

Producer heartbeats and leaves live with the transactions (routes/transactions.py): they wake the
producer's waiting check polls."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, StrictInt
from tidemq.protocol import MAX_CONSUME_FAILURE_CHARS, ErrorCode, validate_client_id

from tidemq_server.broker.messaging.convert import to_wire
from tidemq_server.broker.routes._common import body_doc, broker_of, read_model, wants_msgpack
from tidemq_server.broker.routes.answers import (
    AckAnswer,
    Groups,
    HandleAnswer,
    Members,
    Offsets,
    ReceiveAnswer,
    RetryAnswer,
)
from tidemq_server.broker.routes.raw_ids import path_id
from tidemq_server.common.app import reply
from tidemq_server.common.lean import LeanRoute, lean
from tidemq_server.common.openapi import TOPIC_RULE, Empty, GroupName, errors

router = APIRouter(tags=["groups"], route_class=LeanRoute)


def group_param(request: Request) -> dict[str, str]:
    """The hot group routes' one parameter, a path segment (the service validates the name)."""
    return {"group": request.path_params["group"]}


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HeartbeatBody(_Body):
    client_id: str = Field(min_length=1, max_length=255)
    subscriptions: dict[str, str] = Field(default_factory=dict,
                                          description='topic → "*" or "tagA || tagB"')
    mode: str = Field("clustering", description='"clustering" or "broadcasting"')


class OffsetEntry(_Body):
    topic: str = Field(json_schema_extra=TOPIC_RULE)
    queue_id: StrictInt
    offset: StrictInt


class OffsetsBody(_Body):
    offsets: list[OffsetEntry]
    advance_only: bool = Field(False, description=(
        "only move offsets forward: an offset lower than the committed one is left alone (a "
        "consumer's commit, so that a late retry cannot undo a newer one); false: set as given"))


class RetryBody(_Body):
    message_id: str = Field(min_length=1, max_length=64)
    delay_level: StrictInt | None = None
    # why the consumer failed: kept in the retry/DLQ copy's TIDE_CONSUME_FAILURE property
    reason: str | None = Field(None, max_length=MAX_CONSUME_FAILURE_CHARS)


class ReceiveBody(_Body):
    topic: str = Field(json_schema_extra=TOPIC_RULE)
    tags: str = "*"
    max: StrictInt = Field(16, ge=1, le=1024)
    invisible_ms: StrictInt = Field(30_000, ge=0)
    wait_ms: StrictInt = Field(20_000, ge=0)


class AckBody(_Body):
    receipt_handles: list[str] = Field(max_length=4096)


class InvisibilityBody(_Body):
    receipt_handle: str
    invisible_ms: StrictInt = Field(ge=0)


#: What the endpoints that take receipt handles may answer besides 200.
_HANDLE_ERRORS = (ErrorCode.INVALID_TOPIC_NAME, ErrorCode.INVALID_RECEIPT_HANDLE,
                  ErrorCode.UNAVAILABLE)



@router.get("/v1/groups", summary="Consumer groups known to this broker",
            response_model=Groups, responses=errors(ErrorCode.UNAVAILABLE))
async def list_groups(request: Request) -> Response:
    """Groups with live members or committed offsets: ``{groups: [{group, members, mode,
    subscriptions, topics}]}``; ``mode`` is null for a group with no live member."""
    groups = await broker_of(request).consumers.known_groups()
    return reply(request, {"groups": groups})


@router.post("/v1/groups/{group}/heartbeat", openapi_extra=body_doc(HeartbeatBody),
             summary="Consumer heartbeat; answers the live members (the rebalance view)",
             response_model=Members, responses=errors(ErrorCode.INVALID_TOPIC_NAME))
@lean(group_param)
async def heartbeat(group: GroupName, request: Request) -> Response:
    body = await read_model(request, HeartbeatBody)
    validate_client_id(body.client_id)
    members = broker_of(request).consumers.heartbeat(group, body.client_id,
                                                     body.subscriptions, body.mode)
    return reply(request, {"members": members})


@router.delete("/v1/groups/{group}/members/{client_id}", summary="Leave the group now",
               response_model=Empty, responses=errors(ErrorCode.INVALID_TOPIC_NAME))
async def leave(group: GroupName, client_id: str, request: Request) -> Response:
    broker_of(request).consumers.leave(group, validate_client_id(path_id(client_id)))
    return reply(request, {})


@router.put("/v1/groups/{group}/offsets", openapi_extra=body_doc(OffsetsBody),
            summary="Commit offsets; answered once durable in Redis", response_model=Empty,
            responses=errors(ErrorCode.INVALID_TOPIC_NAME, ErrorCode.TOPIC_NOT_FOUND,
                             ErrorCode.UNAVAILABLE))
async def commit_offsets(group: GroupName, request: Request) -> Response:
    body = await read_model(request, OffsetsBody)
    entries = [(e.topic, e.queue_id, e.offset) for e in body.offsets]
    await broker_of(request).consumers.commit(group, entries, advance_only=body.advance_only)
    return reply(request, {})


@router.get("/v1/groups/{group}/offsets", summary="Committed offsets with max_offset and lag",
            response_model=Offsets,
            responses=errors(ErrorCode.INVALID_TOPIC_NAME, ErrorCode.UNAVAILABLE))
async def get_offsets(group: GroupName, request: Request,
                      topic: Annotated[str | None, Query()] = None) -> Response:
    offsets = await broker_of(request).consumers.committed(group, topic or None)
    return reply(request, {"offsets": offsets})


@router.post("/v1/groups/{group}/retry", openapi_extra=body_doc(RetryBody),
             summary="Send a failed message to the group's retry topic (or DLQ)",
             response_model=RetryAnswer, responses=errors(
                 ErrorCode.INVALID_TOPIC_NAME, ErrorCode.INVALID_DELAY,
                 ErrorCode.MESSAGE_NOT_FOUND, ErrorCode.BROKER_BUSY, ErrorCode.DISK_FULL))
async def retry(group: GroupName, request: Request) -> Response:
    body = await read_model(request, RetryBody)
    destination = await broker_of(request).retries.retry(group, body.message_id,
                                                         body.delay_level, reason=body.reason)
    return reply(request, {"destination": destination})


@router.post("/v1/groups/{group}/receive", openapi_extra=body_doc(ReceiveBody),
             summary="Simple consumer: receive messages with an invisibility time",
             response_model=ReceiveAnswer, responses=errors(
                 ErrorCode.INVALID_TOPIC_NAME, ErrorCode.TOPIC_NOT_FOUND, ErrorCode.UNAVAILABLE))
@lean(group_param)
async def receive(group: GroupName, request: Request) -> Response:
    body = await read_model(request, ReceiveBody)
    received = await broker_of(request).consumers.receive(
        group, body.topic, body.tags, body.max, body.invisible_ms, body.wait_ms)
    binary = wants_msgpack(request)
    messages = []
    for item in received:
        wire = to_wire(item.record, binary)
        wire["reconsume_times"] = item.reconsume_times
        wire["receipt_handle"] = item.receipt_handle
        messages.append(wire)
    return reply(request, {"messages": messages})


@router.post("/v1/groups/{group}/ack", openapi_extra=body_doc(AckBody),
             summary="Simple consumer: acknowledge received messages",
             response_model=AckAnswer, responses=errors(*_HANDLE_ERRORS))
@lean(group_param)
async def ack(group: GroupName, request: Request) -> Response:
    body = await read_model(request, AckBody)
    acked = await broker_of(request).consumers.ack(group, body.receipt_handles)
    return reply(request, {"acked": acked})


@router.post("/v1/groups/{group}/invisibility", openapi_extra=body_doc(InvisibilityBody),
             summary="Simple consumer: change a received message's invisibility",
             response_model=HandleAnswer, responses=errors(*_HANDLE_ERRORS))
async def invisibility(group: GroupName, request: Request) -> Response:
    body = await read_model(request, InvisibilityBody)
    handle = await broker_of(request).consumers.change_invisibility(
        group, body.receipt_handle, body.invisible_ms)
    return reply(request, {"receipt_handle": handle})

