"""Send and pull: the two hot paths. Bodies are decoded by hand (no pydantic on the way in)."""

from __future__ import annotations

import time
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from tidemq.protocol import ErrorCode, validate_group_name

from services.broker.messaging.convert import to_wire
from services.broker.messaging.pull import TagFilter
from services.broker.routes._common import (
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
    wants_msgpack,
)
from services.broker.routes.answers import PullAnswer, SendAnswer
from services.common.app import reply
from services.common.constants import TIMING_HEADER
from services.common.openapi import TopicName, errors

router = APIRouter(tags=["messages"])


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
async def send(topic: TopicName, request: Request) -> Response:
    began = time.monotonic_ns()
    broker = broker_of(request)
    payload = await read_payload(request, broker.sender.max_request_bytes)
    results = await broker.sender.send(topic, payload, client_host(request))
    response = reply(request, {"results": results})
    if TIMING_HEADER in request.headers:  # the latency bench: received, stored (ns)
        response.headers[TIMING_HEADER] = f"recv={began},stored={time.monotonic_ns()}"
    return response


@router.get("/v1/topics/{topic}/queues/{queue_id}/messages", summary="Pull from one queue",
            response_model=PullAnswer, responses=errors(*PULL_ERRORS))
async def pull(
    topic: TopicName,
    request: Request,
    queue_id: QueueId,
    offset: Offset = 0,
    max: PullMax = 32,
    wait_ms: WaitMs = 0,
    tags: Annotated[str, Query(description='"*" or "tagA || tagB"')] = "*",
    group: Annotated[str | None, Query(description="consumer group (lag metrics)")] = None,
) -> Response:
    broker = broker_of(request)
    if group:
        validate_group_name(group)
    answer = await broker.pulls.pull(topic, queue_id, offset, max, wait_ms,
                                     TagFilter.parse(tags), group=group)
    binary = wants_msgpack(request)
    response = reply(request, pull_answer(answer, lambda r: to_wire(r, binary)))
    if TIMING_HEADER in request.headers:  # the latency bench: woken, answered (ns)
        response.headers[TIMING_HEADER] = f"woke={answer.woke_ns},answered={time.monotonic_ns()}"
    return response
