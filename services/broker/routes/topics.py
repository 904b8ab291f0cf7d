"""Topic admin: create or update, list, describe with per-queue offsets, delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, StrictInt
from tidemq.protocol import ErrorCode, parse_perm

from tidemq_server.broker.messaging.topics import validate_queues, validate_shrink
from tidemq_server.broker.routes._common import body_doc, broker_of, read_model
from tidemq_server.broker.routes.answers import DeletedTopic, TopicAnswer, TopicDetail, TopicList
from tidemq_server.common.app import reply
from tidemq_server.common.openapi import TopicName, errors

router = APIRouter(tags=["topics"])


class TopicBody(BaseModel):
    """``PUT /v1/topics/{topic}``: queue count (default: the topic's own, or the broker's for a
    new topic) and permission."""

    model_config = ConfigDict(extra="forbid")

    queues: StrictInt | None = Field(None, description="number of queues, 1-1024; fewer than "
                                     "now only while the dropped queues hold no messages")
    perm: str = Field("rw", description='"rw", "r" (pull only) or "w" (send only)')


@router.put("/v1/topics/{topic}", openapi_extra=body_doc(TopicBody),
            summary="Create or update a topic", response_model=TopicAnswer,
            responses=errors(ErrorCode.INVALID_TOPIC_NAME, ErrorCode.FORBIDDEN_SYSTEM_TOPIC,
                             ErrorCode.QUEUES_NOT_EMPTY))
async def put_topic(topic: TopicName, request: Request) -> Response:
    broker = broker_of(request)
    broker.topics.validate_creatable(topic)
    body = await read_model(request, TopicBody)
    current = broker.topics.get(topic)
    default = current.queues if current is not None else broker.settings.default_queues
    queues = validate_queues(body.queues if body.queues is not None else default)
    validate_shrink(current, queues, broker.store.queue_offsets)
    cfg, changed = await broker.topics.put(topic, queues, parse_perm(body.perm))
    if changed:
        await broker.announce()
    return reply(request, cfg.to_wire())


@router.get("/v1/topics", summary="List topics", response_model=TopicList)
async def list_topics(request: Request) -> Response:
    topics = broker_of(request).topics.list()
    return reply(request, {"topics": [c.to_wire() for c in topics]})


@router.get("/v1/topics/{topic}", summary="Describe a topic with its queue offsets",
            response_model=TopicDetail, responses=errors(ErrorCode.TOPIC_NOT_FOUND))
async def get_topic(
    topic: TopicName, request: Request,
    at_ms: Annotated[int | None, Query(
        ge=0, description="also answer, per queue, `at`: the first offset stored at or after "
                          "this time (epoch ms; `max` when nothing is), e.g. to reset a "
                          "group's offsets to a time")] = None,
) -> Response:
    broker = broker_of(request)
    cfg = broker.topics.require(topic)
    offsets = []
    for queue_id in range(cfg.queues):
        low, high = broker.store.queue_offsets(topic, queue_id)
        entry = {"queue_id": queue_id, "min": low, "max": high}
        if at_ms is not None:
            entry["at"] = max(low, broker.store.offset_for_time(topic, queue_id, at_ms))
        offsets.append(entry)
    return reply(request, {**cfg.to_wire(), "offsets": offsets})


@router.delete("/v1/topics/{topic}", summary="Delete a topic", response_model=DeletedTopic,
               responses=errors(ErrorCode.FORBIDDEN_SYSTEM_TOPIC, ErrorCode.TOPIC_NOT_FOUND))
async def delete_topic(topic: TopicName, request: Request) -> Response:
    """Remove the topic from this broker and its routes from the nameservers.

    Its stored messages stay in the log until retention removes them, unreadable meanwhile;
    re-creating the topic continues its queues (and committed offsets). 403
    FORBIDDEN_SYSTEM_TOPIC for a system topic, 404 TOPIC_NOT_FOUND for an unknown one.
    """
    broker = broker_of(request)
    cfg = await broker.topics.delete(topic)
    await broker.announce()
    return reply(request, {"deleted": cfg.name, "queues": cfg.queues})
