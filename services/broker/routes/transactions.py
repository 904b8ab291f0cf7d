"""Transactional messages (docs/api.md): half messages, ends, the pending list, producer checks."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from tidemq.protocol import ErrorCode, ProtocolError, validate_client_id, validate_group_name
from tidemq.protocol.codec import is_batch
from tidemq.protocol.message import reject_unknown

from tidemq_server.broker.routes._common import (
    WaitMs,
    body_doc,
    broker_of,
    client_host,
    read_payload,
    read_raw,
    wants_msgpack,
)
from tidemq_server.broker.routes.answers import (
    BeginAnswer,
    Checks,
    EndResults,
    EndState,
    PendingTransactions,
)
from tidemq_server.broker.routes.messages import MessageDoc
from tidemq_server.broker.routes.raw_ids import path_id
from tidemq_server.broker.transactions.service import parse_end, parse_ends, parse_group
from tidemq_server.common.app import reply
from tidemq_server.common.lean import LeanRoute, lean
from tidemq_server.common.openapi import GROUP_RULE, TOPIC_RULE, Empty, GroupName, errors

router = APIRouter(tags=["transactions"], route_class=LeanRoute)

MAX_LISTED = 10_000
HALF_FIELDS = frozenset({"producer_group", "topic", "message", "messages", "check_immunity_s",
                         "ends"})  # of POST /v1/transactions
END_ONE_FIELDS = frozenset({"producer_group", "action", "from_check"})
END_BATCH_FIELDS = frozenset({"producer_group", "ends"})
HEARTBEAT_FIELDS = frozenset({"client_id"})
_TX_ERRORS = (ErrorCode.INVALID_TOPIC_NAME, ErrorCode.TRANSACTION_NOT_FOUND,
              ErrorCode.TRANSACTION_ALREADY_ENDED, ErrorCode.BROKER_BUSY, ErrorCode.DISK_FULL)


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EndItemDoc(_Doc):
    transaction_id: str
    action: Literal["commit", "rollback", "unknown"]
    from_check: bool = False


class HalfDoc(_Doc):
    """Documentation only: parsed by hand (msgpack and JSON alike)."""

    producer_group: str = Field(json_schema_extra=GROUP_RULE)
    topic: str = Field(json_schema_extra=TOPIC_RULE)
    message: MessageDoc | None = Field(None, description="one message (or give messages)")
    messages: list[MessageDoc] | None = Field(None, description="a batch of messages")
    check_immunity_s: float | None = Field(None, ge=0, description="first check not before")
    ends: list[EndItemDoc] | None = Field(None, description="optional: ends of other "
                                          "transactions of the group, answered in results")


class EndDoc(_Doc):
    producer_group: str = Field(description="the group that sent the half message (required)",
                                json_schema_extra=GROUP_RULE)
    action: Literal["commit", "rollback", "unknown"]
    from_check: bool = False


class EndBatchDoc(_Doc):
    producer_group: str = Field(description="the group that sent the half messages (required)",
                                json_schema_extra=GROUP_RULE)
    ends: list[EndItemDoc]


class HeartbeatDoc(_Doc):
    client_id: str = Field(min_length=1, max_length=255)


@router.post("/v1/transactions", summary="Store half messages (invisible until committed)",
             openapi_extra=body_doc(HalfDoc), response_model=BeginAnswer,
             responses=errors(ErrorCode.INVALID_DELAY, ErrorCode.INVALID_BODY_ENCODING,
                              ErrorCode.FORBIDDEN_SYSTEM_TOPIC, ErrorCode.TRANSACTIONS_DISABLED,
                              ErrorCode.TOPIC_NOT_FOUND, *_TX_ERRORS))
@lean(lambda request: {"producer_group": request.query_params.get("producer_group"),
                       "topic": request.query_params.get("topic")})
async def begin(
    request: Request,
    producer_group: Annotated[str | None, Query(description="with a batch body (application/"
                                                "x-tidemq-batch) only: the producer group")]
    = None,
    topic: Annotated[str | None, Query(description="with a batch body only: the real topic")]
    = None,
) -> Response:
    broker = broker_of(request)
    broker.transactions.require_enabled()
    if is_batch(request.headers.get("content-type")):  # the SDK's half batches (format v2)
        raw = await read_raw(request, broker.sender.max_request_bytes)
        return reply(request, await broker.transactions.begin_batches(
            producer_group, topic, raw, client_host(request)))
    if producer_group is not None or topic is not None:
        raise ProtocolError(ErrorCode.BAD_REQUEST, "producer_group and topic are query "
                            "parameters of a batch body only; a JSON or msgpack body names "
                            "them itself")
    payload = await read_payload(request, broker.sender.max_request_bytes)
    if isinstance(payload, dict):
        reject_unknown(payload, HALF_FIELDS, "a half-message request")
    answer = await broker.transactions.begin(payload, client_host(request))
    return reply(request, answer)


@router.post("/v1/transactions/end", summary="End many transactions in one request",
             openapi_extra=body_doc(EndBatchDoc), response_model=EndResults,
             responses=errors(*_TX_ERRORS))
@lean(lambda request: {})
async def end_many(request: Request) -> Response:
    payload = await read_payload(request)
    if not isinstance(payload, dict):
        raise ProtocolError(ErrorCode.BAD_REQUEST, 'the body must be {"producer_group", '
                            '"ends": [{transaction_id, action, from_check}]}')
    reject_unknown(payload, END_BATCH_FIELDS, "a batch end")
    group = parse_group(payload)
    ends = parse_ends(payload.get("ends"))
    results = await broker_of(request).transactions.end(group, ends)
    return reply(request, {"results": results})


@router.post("/v1/transactions/{transaction_id}/end", summary="End one transaction",
             openapi_extra=body_doc(EndDoc), response_model=EndState,
             responses=errors(*_TX_ERRORS))
@lean(lambda request: {"transaction_id": request.path_params["transaction_id"]})
async def end_one(transaction_id: str, request: Request) -> Response:
    payload = await read_payload(request)
    if isinstance(payload, dict):
        reject_unknown(payload, END_ONE_FIELDS, "an end")
    group = parse_group(payload)
    req = parse_end(payload, transaction_id)
    result = (await broker_of(request).transactions.end(group, [req]))[0]
    if "code" in result:
        raise ProtocolError(ErrorCode(result["code"]), result["message"])
    return reply(request, {"state": result["state"]})


@router.get("/v1/transactions", summary="Pending transactions with their check counts",
            response_model=PendingTransactions, responses=errors(ErrorCode.INVALID_TOPIC_NAME))
async def pending(
    request: Request,
    producer_group: Annotated[str | None, Query()] = None,
    state: Annotated[str, Query(description='"pending" (half, also after unknown)',
                                json_schema_extra={"enum": ["pending", "half"]})]
    = "pending",
    max: Annotated[int, Query(ge=1, le=MAX_LISTED)] = 1000,
) -> Response:
    if state not in ("pending", "half"):
        raise ProtocolError(ErrorCode.BAD_REQUEST,
                            f"state must be 'pending' (the only list kept), got {state!r}")
    if producer_group is not None:
        validate_group_name(producer_group)
    found = await broker_of(request).checker_requests.pending(producer_group, max)
    return reply(request, {"transactions": found})


@router.post("/v1/producers/{group}/heartbeat", summary="A producer is alive (gets checks)",
             openapi_extra=body_doc(HeartbeatDoc), response_model=Empty,
             responses=errors(ErrorCode.INVALID_TOPIC_NAME))
@lean(lambda request: {"group": request.path_params["group"]})
async def producer_heartbeat(group: GroupName, request: Request) -> Response:
    validate_group_name(group)
    payload = await read_payload(request)
    if isinstance(payload, dict):
        reject_unknown(payload, HEARTBEAT_FIELDS, "a producer heartbeat")
    client_id = validate_client_id(payload.get("client_id") if isinstance(payload, dict)
                                   else None)
    broker_of(request).transactions.heartbeat(group, client_id)
    answer: dict[str, Any] = {}
    return reply(request, answer)


@router.delete("/v1/producers/{group}/members/{client_id}",
               summary="A producer leaves now (no more checks for it)", response_model=Empty,
               responses=errors(ErrorCode.INVALID_TOPIC_NAME))
async def producer_leave(group: GroupName, client_id: str, request: Request) -> Response:
    validate_group_name(group)
    broker_of(request).transactions.leave(group, validate_client_id(path_id(client_id)))
    answer: dict[str, Any] = {}
    return reply(request, answer)


@router.get("/v1/producers/{group}/checks", summary="Long-poll transaction checks",
            response_model=Checks, responses=errors(ErrorCode.INVALID_TOPIC_NAME))
async def checks(
    group: GroupName,
    request: Request,
    client_id: Annotated[str, Query(min_length=1, max_length=255)],
    max: Annotated[int, Query(ge=1, le=1024)] = 256,
    wait_ms: WaitMs = 20_000,
) -> Response:
    validate_group_name(group)
    validate_client_id(client_id)
    broker = broker_of(request)
    wait_ms = min(wait_ms, broker.settings.long_poll_max_ms)
    found = await broker.transactions.poll_checks(group, client_id, max, wait_ms,
                                                  wants_msgpack(request),
                                                  request.is_disconnected)
    return reply(request, {"checks": found})
