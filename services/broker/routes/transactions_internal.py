"""``/internal/v1/transactions/*``: what the checker reads and asks (cluster token required)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from tidemq_server.broker.routes._common import (
    Offset,
    WaitMs,
    body_doc,
    broker_of,
    internal_auth,
    read_payload,
)
from tidemq_server.broker.routes.answers_internal import ActionResults, BrokerIdentity, Halves, Ops
from tidemq_server.broker.transactions.checker_requests import MAX_PAGE
from tidemq_server.common.app import reply

router = APIRouter(prefix="/internal/v1/transactions", tags=["internal"],
                   dependencies=[Depends(internal_auth)])


class ActionDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")

    transaction_id: str
    physical_offset: int = Field(description="of the half message the decision is about")
    action: Literal["check", "defer", "discard"]


class ActionsDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")

    actions: list[ActionDoc]


@router.get("/info", summary="Which broker this is (the checker's progress is kept per broker)",
            response_model=BrokerIdentity)
async def info(request: Request) -> Response:
    broker = broker_of(request)
    return reply(request, {"broker_name": broker.settings.broker_name,
                           "cluster": broker.settings.cluster})


PageSize = Annotated[int, Query(ge=1, le=MAX_PAGE, description="entries at most")]


@router.get("/halves", summary="A page of the half queue (metadata, no bodies); held up to "
            "wait_ms at the end of the queue until a half message arrives",
            response_model=Halves)
async def halves(
    request: Request,
    offset: Offset = 0,
    max: PageSize = 256,
    wait_ms: WaitMs = 0,
) -> Response:
    checker = broker_of(request).checker_requests
    return reply(request, await checker.halves_held(offset, max, wait_ms))


@router.get("/ops", summary="A page of the op queue: the transaction ids it ends",
            response_model=Ops)
async def ops(
    request: Request,
    offset: Offset = 0,
    max: PageSize = 256,
) -> Response:
    return reply(request, broker_of(request).checker_requests.ops(offset, max))


@router.post("/actions", summary="Check, defer or discard half messages",
             openapi_extra=body_doc(ActionsDoc), response_model=ActionResults)
async def actions(request: Request) -> Response:
    payload = await read_payload(request)
    results = await broker_of(request).checker_requests.act(payload)
    return reply(request, {"results": results})
