"""Read-mostly endpoints for operators and the web console (docs/api.md): one transaction in
any state, resolving a discarded one by hand, a message's trace, and pending timers by due hour
or day. Kept apart from the producer's transaction routes: resolving is not ending."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from tidemq.protocol import ErrorCode, ProtocolError
from tidemq.protocol.message import reject_unknown

from tidemq_server.broker.routes._common import body_doc, broker_of, read_payload
from tidemq_server.broker.routes.answers import PendingTransaction
from tidemq_server.broker.routes.raw_ids import path_id
from tidemq_server.broker.trace import trace
from tidemq_server.broker.transactions import resolve as resolving
from tidemq_server.broker.transactions.service import parse_group
from tidemq_server.common.answers import Histogram
from tidemq_server.common.app import reply
from tidemq_server.common.openapi import GROUP_RULE, errors

router = APIRouter(tags=["inspection"])

RESOLVE_FIELDS = frozenset({"action", "producer_group"})


class TransactionView(PendingTransaction):
    resolution: Literal["committed", "dropped"] | None = Field(
        None, description="a discarded one: what an operator decided (null: nothing yet)")


class ResolveDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")

    action: Literal["commit", "drop"]
    producer_group: str | None = Field(None, description="optional: must be the "
                                       "transaction's", json_schema_extra=GROUP_RULE)


class Resolved(BaseModel):
    transaction_id: str
    message_id: str
    state: Literal["discarded"]
    resolution: Literal["committed", "dropped"]


class TraceCopy(BaseModel):
    kind: str = Field(description="half, discarded, committed, delayed, cancelled, delivered, "
                      "stored, retry or dlq")
    topic: str
    queue_id: int
    queue_offset: int
    store_timestamp_ms: int
    check_times: int | None = None
    deliver_at_ms: int | None = None
    reconsume_times: int | None = None
    resent_as: str | None = Field(None, description="a dlq copy an operator resent: the "
                                  "resent copy's message id (dlq-<40 hex>)")


class Trace(BaseModel):
    message_id: str
    topic: str
    state: str
    born_timestamp_ms: int
    transaction: dict[str, Any] | None = Field(description="as GET /v1/transactions/{id}")
    delay: dict[str, Any] | None = Field(description="{deliver_at_ms, state: scheduled | "
                                         "cancelled | delivered, delivered_ms?}")
    consumable: dict[str, Any] | None = Field(description="{topic, queue_id, queue_offset} "
                                              "of the copy consumers read")
    retries: list[dict[str, Any]]
    copies: list[TraceCopy]
    resent: list[dict[str, Any]] = Field(default_factory=list, description="copies resent from "
                                         "the DLQ: {message_id, topic, queue_id, queue_offset, "
                                         "store_timestamp_ms}")


@router.get("/v1/transactions/{transaction_id}", summary="One transaction, in any state",
            response_model=TransactionView, responses=errors(ErrorCode.TRANSACTION_NOT_FOUND))
async def transaction(transaction_id: str, request: Request) -> Response:
    return reply(request, resolving.describe(broker_of(request).transactions, transaction_id))


@router.post("/v1/transactions/{transaction_id}/resolve",
             summary="Commit or drop a discarded transaction (an operator's decision)",
             openapi_extra=body_doc(ResolveDoc), response_model=Resolved,
             responses=errors(ErrorCode.TRANSACTION_NOT_FOUND,
                              ErrorCode.TRANSACTION_ALREADY_ENDED, ErrorCode.BROKER_BUSY,
                              ErrorCode.DISK_FULL))
async def resolve(transaction_id: str, request: Request) -> Response:
    payload = await read_payload(request)
    if not isinstance(payload, dict):
        raise ProtocolError(ErrorCode.BAD_REQUEST,
                            'the body must be {"action": "commit" | "drop"}')
    reject_unknown(payload, RESOLVE_FIELDS, "a resolve")
    group = parse_group(payload, required=False)
    action = payload.get("action")
    if not isinstance(action, str):
        raise ProtocolError(ErrorCode.BAD_REQUEST, 'action must be "commit" or "drop"')
    answer = await resolving.resolve(broker_of(request).transactions, transaction_id, action,
                                     group)
    return reply(request, answer)


@router.get("/v1/messages/{message_id}/trace", summary="Every copy of a message, named",
            response_model=Trace, responses=errors(ErrorCode.MESSAGE_NOT_FOUND))
async def message_trace(message_id: str, request: Request) -> Response:
    broker = broker_of(request)
    return reply(request, trace(broker.queries, broker.transactions, path_id(message_id)))


@router.get("/v1/scheduled/histogram", summary="Pending timers by hour or day of due time",
            response_model=Histogram, responses=errors(ErrorCode.UNAVAILABLE))
async def scheduled_histogram(
    request: Request,
    by: Annotated[Literal["hour", "day"], Query(description="bucket width")] = "hour",
) -> Response:
    return reply(request, await broker_of(request).delays.histogram(by))
