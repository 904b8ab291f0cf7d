"""Message queries: by id (with state), by key, by topic and time range."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from tidemq.protocol import ErrorCode, ProtocolError

from services.broker.messaging.convert import to_wire
from services.broker.messaging.query import DEFAULT_QUERY, MAX_QUERY
from services.broker.routes._common import broker_of, wants_msgpack
from services.common.app import reply

router = APIRouter(tags=["query"])


@router.get("/v1/messages/{message_id}", summary="A message by id, with its state")
async def get_message(message_id: str, request: Request) -> Response:
    record, state = broker_of(request).queries.by_id(message_id)
    wire = to_wire(record, wants_msgpack(request))
    wire["state"] = state.value
    return reply(request, wire)


@router.get("/v1/messages", summary="Messages of a topic by key, or by store time range")
async def find_messages(
    request: Request,
    topic: Annotated[str, Query(min_length=1)],
    key: Annotated[str | None, Query()] = None,
    begin_ms: Annotated[int | None, Query(ge=0)] = None,
    end_ms: Annotated[int | None, Query(ge=0)] = None,
    max: Annotated[int, Query(ge=1, le=MAX_QUERY)] = DEFAULT_QUERY,
) -> Response:
    queries = broker_of(request).queries
    if key is not None:
        records = queries.by_key(topic, key, begin_ms or 0, end_ms if end_ms is not None
                                 else 2**62, max)
    elif begin_ms is not None and end_ms is not None:
        records = queries.by_time(topic, begin_ms, end_ms, max)
    else:
        raise ProtocolError(ErrorCode.BAD_REQUEST,
                            "give topic with key, or topic with begin_ms and end_ms")
    binary = wants_msgpack(request)
    return reply(request, {"messages": [to_wire(r, binary) for r in records]})
