"""Topic admin: create or update, list, describe with per-queue offsets."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from services.broker.messaging.topics import check_queues, parse_perm
from services.broker.routes._common import body_doc, broker_of, read_model
from services.common.app import reply

router = APIRouter(tags=["topics"])


class TopicBody(BaseModel):
    """``PUT /v1/topics/{topic}``: queue count (default: the broker's) and permission."""

    model_config = ConfigDict(extra="ignore")

    queues: int | None = Field(None, description="number of queues, 1-1024")
    perm: str = Field("rw", description='"rw", "r" (pull only) or "w" (send only)')


@router.put("/v1/topics/{topic}", openapi_extra=body_doc(TopicBody),
            summary="Create or update a topic")
async def put_topic(topic: str, request: Request) -> Response:
    broker = broker_of(request)
    broker.topics.check_creatable(topic)
    body = await read_model(request, TopicBody)
    queues = check_queues(body.queues if body.queues is not None
                          else broker.settings.default_queues)
    cfg, changed = await broker.topics.put(topic, queues, parse_perm(body.perm))
    if changed:
        await broker.announce()
    return reply(request, cfg.to_wire())


@router.get("/v1/topics", summary="List topics")
async def list_topics(request: Request) -> Response:
    topics = broker_of(request).topics.list()
    return reply(request, {"topics": [c.to_wire() for c in topics]})


@router.get("/v1/topics/{topic}", summary="Describe a topic with its queue offsets")
async def get_topic(topic: str, request: Request) -> Response:
    broker = broker_of(request)
    cfg = broker.topics.require(topic)
    offsets = []
    for queue_id in range(cfg.queues):
        low, high = broker.store.queue_offsets(topic, queue_id)
        offsets.append({"queue_id": queue_id, "min": low, "max": high})
    return reply(request, {**cfg.to_wire(), "offsets": offsets})
