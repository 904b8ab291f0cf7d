"""``/internal/`` endpoints for the checker, scheduler and metrics sidecar (token required).

Small on purpose: write records as they are, read them raw, read one by physical offset, and
hold retention back to a consumer's progress. The request shapes and their handling live in
``tidemq_server.broker.internal``.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, StrictInt
from tidemq.protocol import ErrorCode
from tidemq.protocol.numbers import INT64_MAX

from tidemq_server.broker.messaging.convert import to_internal_wire
from tidemq_server.broker.messaging.pull import DEFAULT_PULL, TagFilter
from tidemq_server.broker.routes._common import (
    PULL_ERRORS,
    Offset,
    PullMax,
    QueueId,
    StrictBody,
    WaitMs,
    body_doc,
    broker_of,
    internal_auth,
    pull_answer,
    read_model,
    read_payload,
    wants_msgpack,
)
from tidemq_server.broker.routes.answers_internal import PutResults, RawPull, RawRecord
from tidemq_server.common.app import reply
from tidemq_server.common.openapi import Empty, TopicName, errors

router = APIRouter(prefix="/internal/v1", tags=["internal"], dependencies=[Depends(internal_auth)])


class RecordDoc(BaseModel):
    """A record written as it is; documentation only (parsed in tidemq_server.broker.internal)."""

    model_config = ConfigDict(extra="forbid")

    topic: str | None = Field(None, description="default: the topic in the path")
    queue_id: int = 0
    body: str = ""
    body_encoding: str = Field("utf-8", description='"utf-8" or "base64" (raw bytes: msgpack)')
    properties: dict[str, str] = Field(default_factory=dict,
                                       description="raw, reserved names allowed; UNIQ_KEY is "
                                                   "assigned when absent")
    tag_code: int | None = Field(None, description="consume-queue tag slot; default: hash of "
                                                   "the TAGS property")
    flag: int = 0
    sys_flag: int = 0
    born_timestamp_ms: int | None = None
    born_host: str = "127.0.0.1:0"
    reconsume_times: int = 0
    prepared_tx_offset: int = 0


class RecordsDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")

    records: list[RecordDoc]
    dedup: bool = Field(False, description="skip records whose (topic, UNIQ_KEY) is stored")


class RetentionFloorBody(StrictBody):
    owner: str = Field(min_length=1, max_length=255)
    physical_offset: StrictInt = Field(ge=0, le=INT64_MAX)


async def _put(topic: str, request: Request) -> Response:
    broker = broker_of(request)
    payload = await read_payload(request, broker.sender.max_request_bytes)
    results = await broker.internal.put(topic, payload)
    return reply(request, {"results": results})


@router.post("/topics/{topic}/messages", openapi_extra=body_doc(RecordsDoc),
             summary="Write records to any topic (system topics included)",
             response_model=PutResults, responses=errors(
                 ErrorCode.INVALID_TOPIC_NAME, ErrorCode.INVALID_BODY_ENCODING,
                 ErrorCode.TOPIC_NOT_FOUND, ErrorCode.BROKER_BUSY, ErrorCode.DISK_FULL))
async def put_records(topic: TopicName, request: Request) -> Response:
    return await _put(topic, request)


@router.get("/topics/{topic}/queues/{queue_id}/messages",
            summary="Pull raw records (system topics included)", response_model=RawPull,
            responses=errors(*PULL_ERRORS))
async def pull_records(
    topic: TopicName,
    request: Request,
    queue_id: QueueId,
    offset: Offset = 0,
    max: PullMax = DEFAULT_PULL,
    wait_ms: WaitMs = 0,
    tags: Annotated[str, Query()] = "*",
) -> Response:
    broker = broker_of(request)
    answer = await broker.pulls.pull(topic, queue_id, offset, max, wait_ms,
                                     TagFilter.parse(tags), internal=True)
    binary = wants_msgpack(request)
    return reply(request, pull_answer(answer, lambda r: to_internal_wire(r, binary)))


@router.get("/records/{physical_offset}", summary="One record by physical offset",
            response_model=RawRecord, responses=errors(ErrorCode.MESSAGE_NOT_FOUND))
async def read_record(physical_offset: int, request: Request) -> Response:
    record = broker_of(request).internal.read(physical_offset)
    return reply(request, to_internal_wire(record, wants_msgpack(request)))


@router.post("/retention-floor", openapi_extra=body_doc(RetentionFloorBody),
             summary="Keep commit log segments from this physical offset on",
             response_model=Empty)
async def retention_floor(request: Request) -> Response:
    body = await read_model(request, RetentionFloorBody)
    broker_of(request).internal.set_retention_floor(body.owner, body.physical_offset)
    answer: dict[str, Any] = {}
    return reply(request, answer)
