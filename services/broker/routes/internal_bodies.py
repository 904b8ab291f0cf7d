"""``GET /internal/v1/topics/{topic}/queues/{queue_id}/bodies``: bodies only, in bulk.

For readers that need nothing but the body and the queue offset of each record — the metrics
sidecar reads ``TIDE_SYS_TRANS_EVENTS`` this way. Same semantics as the internal pull (offsets,
long poll, ``next_offset``), without building a full record per message, so the broker spends
about half the time per record. msgpack answers carry raw bytes; JSON answers carry base64.
"""

from __future__ import annotations

import base64

from fastapi import APIRouter, Depends, Request, Response

from tidemq_server.broker.messaging.pull import TagFilter
from tidemq_server.broker.routes._common import (
    PULL_ERRORS,
    Offset,
    PullMax,
    QueueId,
    WaitMs,
    broker_of,
    internal_auth,
    wants_msgpack,
)
from tidemq_server.broker.routes.answers_internal import Bodies
from tidemq_server.common.app import reply
from tidemq_server.common.openapi import TopicName, errors

router = APIRouter(prefix="/internal/v1", tags=["internal"], dependencies=[Depends(internal_auth)])

_ALL = TagFilter.parse("*")


@router.get("/topics/{topic}/queues/{queue_id}/bodies",
            summary="Pull record bodies and queue offsets only (system topics included)",
            response_model=Bodies, responses=errors(*PULL_ERRORS))
async def pull_bodies(
    topic: TopicName,
    request: Request,
    queue_id: QueueId,
    offset: Offset = 0,
    max: PullMax = 1024,
    wait_ms: WaitMs = 0,
) -> Response:
    answer = await broker_of(request).pulls.pull(topic, queue_id, offset, max, wait_ms, _ALL,
                                                 internal=True)
    records = answer.records
    binary = wants_msgpack(request)
    bodies = [r.body for r in records] if binary else [
        base64.b64encode(r.body).decode("ascii") for r in records]
    return reply(request, {
        "offsets": [r.queue_offset for r in records],
        "bodies": bodies,
        "body_encoding": "bytes" if binary else "base64",
        "next_offset": answer.next_offset,
        "min_offset": answer.min_offset,
        "max_offset": answer.max_offset,
    })
