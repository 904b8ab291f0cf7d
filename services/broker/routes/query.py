"""Message queries: by id (with state), by key, by topic and time range."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from tidemq.protocol import ErrorCode, ProtocolError

from tidemq_server.broker.delays.routing import waiting_fields
from tidemq_server.broker.messaging.convert import to_wire
from tidemq_server.broker.messaging.query import (
    DEFAULT_QUERY,
    MAX_QUERY,
    MessageState,
    retry_history,
)
from tidemq_server.broker.routes._common import broker_of, wants_msgpack
from tidemq_server.broker.routes.answers import Messages, StoredMessageOut
from tidemq_server.broker.routes.raw_ids import path_id
from tidemq_server.common.app import reply
from tidemq_server.common.openapi import errors

router = APIRouter(tags=["query"])


@router.get("/v1/messages/{message_id}", summary="A message by id, with its state",
            response_model=StoredMessageOut, responses=errors(ErrorCode.MESSAGE_NOT_FOUND))
async def get_message(message_id: str, request: Request) -> Response:
    """The message as sent (never a retry copy) with its ``state``; once a consumer group sent
    it back, ``retries`` lists per group the reconsume count and where each copy went."""
    queries = broker_of(request).queries
    copies = queries.copies(path_id(message_id))
    record, state = queries.copies_state(copies)
    wire = to_wire(record, wants_msgpack(request))
    wire["state"] = state.value
    if state in (MessageState.SCHEDULED, MessageState.CANCELLED):
        wire.update(waiting_fields(record))
    retries = retry_history(copies)
    if retries:
        wire["retries"] = retries
    return reply(request, wire)


@router.get("/v1/messages", summary="Messages of a topic by key, or by store time range",
            response_model=Messages,
            responses=errors(ErrorCode.INVALID_TOPIC_NAME, ErrorCode.TOPIC_NOT_FOUND))
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
    messages = []
    for record in records:
        wire = to_wire(record, binary)
        wire["state"] = queries.state_of(record).value
        messages.append(wire)
    return reply(request, {"messages": messages})
