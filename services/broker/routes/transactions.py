"""Transactional messages (API.md): half messages, ends, the pending list, producer checks."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, Field
from tidemq.protocol import ErrorCode, ProtocolError, validate_group_name

from services.broker.routes._common import (
    body_doc,
    broker_of,
    client_host,
    read_payload,
    wants_msgpack,
)
from services.broker.routes.messages import MessageDoc
from services.broker.transactions.service import parse_end, parse_ends, parse_group
from services.common.app import reply

router = APIRouter(tags=["transactions"])

MAX_LISTED = 10_000


class EndItemDoc(BaseModel):
    transaction_id: str
    action: Literal["commit", "rollback", "unknown"]
    from_check: bool = False


class HalfDoc(BaseModel):
    """Documentation only: parsed by hand (msgpack and JSON alike)."""

    producer_group: str
    topic: str
    message: MessageDoc | None = Field(None, description="one message (or give messages)")
    messages: list[MessageDoc] | None = Field(None, description="a batch of messages")
    check_immunity_s: float | None = Field(None, ge=0, description="first check not before")
    ends: list[EndItemDoc] | None = Field(None, description="optional: ends of other "
                                          "transactions of the group, answered in results")


class EndDoc(BaseModel):
    producer_group: str | None = None
    action: Literal["commit", "rollback", "unknown"]
    from_check: bool = False


class EndBatchDoc(BaseModel):
    producer_group: str | None = None
    ends: list[EndItemDoc]


class HeartbeatDoc(BaseModel):
    client_id: str = Field(min_length=1, max_length=255)


@router.post("/v1/transactions", summary="Store half messages (invisible until committed)",
             openapi_extra=body_doc(HalfDoc))
async def begin(request: Request) -> Response:
    broker = broker_of(request)
    broker.transactions.check_enabled()
    payload = await read_payload(request, broker.sender.max_request_bytes)
    answer = await broker.transactions.begin(payload, client_host(request))
    return reply(request, answer)


@router.post("/v1/transactions/end", summary="End many transactions in one request",
             openapi_extra=body_doc(EndBatchDoc))
async def end_many(request: Request) -> Response:
    payload = await read_payload(request)
    if not isinstance(payload, dict):
        raise ProtocolError(ErrorCode.BAD_REQUEST, 'the body must be {"producer_group", '
                            '"ends": [{transaction_id, action, from_check}]}')
    group = parse_group(payload, required=False)
    ends = parse_ends(payload.get("ends"))
    results = await broker_of(request).transactions.end(group, ends)
    return reply(request, {"results": results})


@router.post("/v1/transactions/{transaction_id}/end", summary="End one transaction",
             openapi_extra=body_doc(EndDoc))
async def end_one(transaction_id: str, request: Request) -> Response:
    payload = await read_payload(request)
    group = parse_group(payload, required=False)
    req = parse_end(payload, transaction_id)
    result = (await broker_of(request).transactions.end(group, [req]))[0]
    if "code" in result:
        raise ProtocolError(ErrorCode(result["code"]), result["message"])
    return reply(request, {"state": result["state"]})


@router.get("/v1/transactions", summary="Pending transactions with their check counts")
async def pending(
    request: Request,
    producer_group: Annotated[str | None, Query()] = None,
    state: Annotated[str, Query(description='"pending" (half, also after unknown)')]
    = "pending",
    max: Annotated[int, Query(ge=1, le=MAX_LISTED)] = 1000,
) -> Response:
    if state not in ("pending", "half"):
        raise ProtocolError(ErrorCode.BAD_REQUEST,
                            f"state must be 'pending' (the only list kept), got {state!r}")
    if producer_group is not None:
        validate_group_name(producer_group)
    found = await broker_of(request).tx_checking.pending(producer_group, max)
    return reply(request, {"transactions": found})


@router.post("/v1/producers/{group}/heartbeat", summary="A producer is alive (gets checks)",
             openapi_extra=body_doc(HeartbeatDoc))
async def producer_heartbeat(group: str, request: Request) -> Response:
    validate_group_name(group)
    payload = await read_payload(request)
    client_id = payload.get("client_id") if isinstance(payload, dict) else None
    if not isinstance(client_id, str) or not client_id or len(client_id) > 255:
        raise ProtocolError(ErrorCode.BAD_REQUEST, "client_id must be a string of 1-255 chars")
    broker_of(request).transactions.heartbeat(group, client_id)
    answer: dict[str, Any] = {}
    return reply(request, answer)


@router.delete("/v1/producers/{group}/members/{client_id}",
               summary="A producer leaves now (no more checks for it)")
async def producer_leave(group: str, client_id: str, request: Request) -> Response:
    validate_group_name(group)
    broker_of(request).producers.leave(group, client_id)
    answer: dict[str, Any] = {}
    return reply(request, answer)


@router.get("/v1/producers/{group}/checks", summary="Long-poll transaction checks")
async def checks(
    group: str,
    request: Request,
    client_id: Annotated[str, Query(min_length=1, max_length=255)],
    max: Annotated[int, Query(ge=1, le=1024)] = 256,
    wait_ms: Annotated[int, Query(ge=0, le=30_000)] = 20_000,
) -> Response:
    validate_group_name(group)
    broker = broker_of(request)
    wait_ms = min(wait_ms, broker.settings.long_poll_max_ms)
    found = await broker.transactions.poll_checks(group, client_id, max, wait_ms,
                                                  wants_msgpack(request),
                                                  request.is_disconnected)
    return reply(request, {"checks": found})
