"""Send and pull: the two hot paths. Bodies are decoded by hand (no pydantic on the way in), and
parameters too (``LeanRoute``: FastAPI documents them and answers the invalid ones)."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from tidemq.protocol import ErrorCode, validate_group_name
from tidemq.protocol.codec import CONTENT_MSGPACK, encode_payload, is_batch

from tidemq_server.broker.messaging.convert import to_wire
from tidemq_server.broker.messaging.pull import DEFAULT_PULL, MAX_PULL, TagFilter
from tidemq_server.broker.messaging.pull_many import (
    MAX_PULL_QUEUES,
    ManyPuller,
    many_answer,
    parse_wants,
    pull_form,
)
from tidemq_server.broker.routes._common import (
    LONG_POLL_MAX_MS,
    PULL_ERRORS,
    Offset,
    PullMax,
    QueueId,
    WaitMs,
    body_doc,
    broker_of,
    client_host,
    pull_answer,
    read_payload,
    read_raw,
    wants_msgpack,
)
from tidemq_server.broker.routes.answers import PullAnswer, PullManyAnswer, SendAnswer
from tidemq_server.common.app import reply
from tidemq_server.common.constants import TIMING_HEADER
from tidemq_server.common.lean import LeanRoute, lean, plain_int
from tidemq_server.common.openapi import TopicName, errors

router = APIRouter(tags=["messages"], route_class=LeanRoute)


def msgpack_reply(payload: dict[str, Any]) -> Response:
    """A stored-form answer: msgpack whatever the client accepts (it carries raw bytes)."""
    return Response(encode_payload(payload, CONTENT_MSGPACK), media_type=CONTENT_MSGPACK)


def send_params(request: Request) -> dict[str, Any]:
    """``send``'s parameters: the topic is any path segment (the sender validates the name)."""
    return {"topic": request.path_params["topic"]}


def pull_params(request: Request) -> dict[str, Any] | None:
    """``pull``'s parameters when all are plain and in range (as its signature declares)."""
    query = request.query_params
    queue_id = plain_int(request.path_params["queue_id"], 0)
    offset = plain_int(query.get("offset", "0"), 0)
    max_ = plain_int(query.get("max", str(DEFAULT_PULL)), 1, MAX_PULL)
    wait_ms = plain_int(query.get("wait_ms", "0"), 0, LONG_POLL_MAX_MS)
    if queue_id is None or offset is None or max_ is None or wait_ms is None:
        return None
    return {"topic": request.path_params["topic"], "queue_id": queue_id, "offset": offset,
            "max": max_, "wait_ms": wait_ms, "tags": query.get("tags", "*"),
            "group": query.get("group"), "form": query.get("form", "messages")}


class MessageDoc(BaseModel):
    """A message to send (docs/api.md "Message"); documentation only, parsed by tidemq.protocol
    (which refuses unknown fields too)."""

    model_config = ConfigDict(extra="forbid")

    message_id: str | None = Field(None, max_length=64, description="identity; the SDK sets one")
    body: str = Field("", description="text, base64 text, or raw bytes in msgpack")
    body_encoding: Literal["utf-8", "base64"] = "utf-8"
    tag: str | None = None
    keys: list[str] = []
    properties: dict[str, str] = {}
    queue_id: int | None = Field(None, description="a fixed queue")
    sharding_key: str | None = Field(None, description="same key → same queue (ordered)")
    delay_level: int = Field(0, description="1-18; at most one of the three delay fields")
    delay_ms: int | None = None
    deliver_at_ms: int | None = None


class SendDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")

    messages: list[MessageDoc]


@router.post("/v1/topics/{topic}/messages", summary="Send a batch of messages",
             openapi_extra=body_doc(SendDoc, "validated and stored as a whole"),
             response_model=SendAnswer, responses=errors(
                 ErrorCode.INVALID_TOPIC_NAME, ErrorCode.INVALID_DELAY,
                 ErrorCode.INVALID_BODY_ENCODING, ErrorCode.FORBIDDEN_SYSTEM_TOPIC,
                 ErrorCode.TOPIC_NOT_FOUND, ErrorCode.BROKER_BUSY, ErrorCode.DISK_FULL))
@lean(send_params)
async def send(topic: TopicName, request: Request) -> Response:
    began = time.monotonic_ns()
    broker = broker_of(request)
    sender = broker.sender
    if is_batch(request.headers.get("content-type")):  # the SDK's batches (record format v2)
        raw = await read_raw(request, sender.max_request_bytes)
        response = reply(request, await sender.send_batches(topic, raw, client_host(request)))
    else:
        payload = await read_payload(request, sender.max_request_bytes)
        results = await sender.send(topic, payload, client_host(request))
        response = reply(request, {"results": results})
    if TIMING_HEADER in request.headers:  # the latency bench: received, stored (ns)
        response.headers[TIMING_HEADER] = f"recv={began},stored={time.monotonic_ns()}"
    return response


@router.get("/v1/topics/{topic}/queues/{queue_id}/messages", summary="Pull from one queue",
            response_model=PullAnswer, responses=errors(*PULL_ERRORS))
@lean(pull_params)
async def pull(
    topic: TopicName,
    request: Request,
    queue_id: QueueId,
    offset: Offset = 0,
    max: PullMax = DEFAULT_PULL,
    wait_ms: WaitMs = 0,
    tags: Annotated[str, Query(description='"*" or "tagA || tagB"')] = "*",
    group: Annotated[str | None, Query(description="consumer group (lag metrics)")] = None,
    form: Annotated[str, Query(description='"messages", or "stored": the records as the log '
                                           'holds them, in msgpack (docs/api.md)')] = "messages",
) -> Response:
    broker = broker_of(request)
    if group:
        validate_group_name(group)
    stored = pull_form(form)
    answer = await broker.pulls.pull(topic, queue_id, offset, max, wait_ms,
                                     TagFilter.parse(tags), group=group, stored=stored)
    if stored:
        response = msgpack_reply({"stored": answer.stored, "next_offset": answer.next_offset,
                                  "min_offset": answer.min_offset,
                                  "max_offset": answer.max_offset})
    else:
        binary = wants_msgpack(request)
        response = reply(request, pull_answer(answer, lambda r: to_wire(r, binary)))
    if TIMING_HEADER in request.headers:  # the latency bench: woken, answered (ns)
        response.headers[TIMING_HEADER] = f"woke={answer.woke_ns},answered={time.monotonic_ns()}"
    return response


class PullQueueDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")

    topic: str
    queue_id: int = Field(ge=0)
    offset: int = Field(0, ge=0, description="first queue offset to read")
    tags: str = Field("*", description='"*" or "tagA || tagB"')


class PullManyDoc(BaseModel):
    """Documentation only: read by ``parse_wants``."""

    model_config = ConfigDict(extra="forbid")

    queues: list[PullQueueDoc] = Field(min_length=1, max_length=MAX_PULL_QUEUES)
    form: Literal["messages", "stored"] = Field(
        "messages", description='"stored": each queue answers its records as the log holds '
                                'them (a "stored" blob, msgpack only; docs/api.md)')
    max: int = Field(DEFAULT_PULL, ge=1, le=MAX_PULL, description="messages at most per queue")
    wait_ms: int = Field(0, ge=0, le=LONG_POLL_MAX_MS,
                         description="long poll while no queue has a message (ms)")
    group: str | None = Field(None, description="consumer group (lag metrics)")


@router.post("/v1/pull", summary="Pull from many queues at once (one long poll)",
             openapi_extra=body_doc(PullManyDoc, "the queues, each with its offset"),
             response_model=PullManyAnswer, responses=errors(ErrorCode.BAD_REQUEST))
@lean(lambda request: {})
async def pull_many(request: Request) -> Response:
    broker = broker_of(request)
    payload = await read_payload(request)
    wants, max_count, wait_ms, group = parse_wants(payload)
    stored = pull_form(payload.get("form"))
    answer = await ManyPuller(broker.pulls).pull(wants, max_count, wait_ms, group, stored)
    binary = wants_msgpack(request)
    body = many_answer(answer, lambda r: to_wire(r, binary), stored)
    response = msgpack_reply(body) if stored else reply(request, body)
    if TIMING_HEADER in request.headers:  # the latency bench: woken, answered (ns)
        response.headers[TIMING_HEADER] = f"woke={answer.woke_ns},answered={time.monotonic_ns()}"
    return response
