"""``/internal/v1/replication/*``: log shipping inside a broker group (cluster token required).

- ``GET fetch``: a replica's long-polled fetch of raw log bytes from its end (its ``from`` is
  its acknowledgement); the answer also carries the primary's epoch, epoch history, high-water
  mark, log bounds and metadata version. msgpack answers carry raw bytes, JSON base64; asked
  for ``application/vnd.tidemq.log-chunk`` (a replica does) the body is the raw bytes alone and
  the rest is in ``x-tidemq-fetch-*`` headers (replication/chunkwire.py).
- ``GET log``: raw log bytes from an offset, for comparing copies (acknowledges nothing).
- ``GET epochs``, ``GET metadata``, ``GET status``: the epoch history, the topic table, and
  this broker's replication state.
- ``POST role``: the role seam (promote / demote) for an operator or a failover controller;
- ``POST restart``: this broker stops cleanly, as on SIGTERM (a primary hands its lead over at
  once), for its supervisor (`tidemq up`, compose's restart policy, systemd) to start it
  again: one step of `tidemq broker restart` (services/cli/brokers.py). ``status`` carries the
  process id, and the request names it (``{pid}``): a request repeated after the restart, or
  one not meant for this very process, stops nothing.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, Field, StrictInt
from tidemq.protocol import ErrorCode, ProtocolError
from tidemq.protocol.numbers import INT64_MAX

from tidemq_server.broker.replication.chunkwire import CONTENT_CHUNK, chunk_headers, wants_chunk
from tidemq_server.broker.replication.follower import H_REASON
from tidemq_server.broker.replication.role import Role, StaleEpochError
from tidemq_server.broker.replication.source import FetchRefused
from tidemq_server.broker.routes._common import (
    StrictBody,
    body_doc,
    broker_of,
    internal_auth,
    read_model,
)
from tidemq_server.broker.store.replicated import ChunkError
from tidemq_server.common.app import error_response, reply
from tidemq_server.common.constants import LONG_POLL_MAX_MS
from tidemq_server.common.openapi import errors

router = APIRouter(prefix="/internal/v1/replication", tags=["internal"],
                   dependencies=[Depends(internal_auth)])

LogOffset = Annotated[int, Query(alias="from", ge=0, le=INT64_MAX,
                                 description="physical offset to read from")]
MaxBytes = Annotated[int, Query(ge=1, le=64 * 1024 * 1024, description="bytes at most "
                                "(the first record is sent whole even when larger)")]
RESTART_AFTER_S = 0.05  # the answer to POST restart goes out before the stop begins (s)
REFUSAL_CODES = {"not_primary": ErrorCode.NOT_PRIMARY, "out_of_range":
                 ErrorCode.OFFSET_OUT_OF_RANGE, "diverged": ErrorCode.OFFSET_OUT_OF_RANGE}


class EpochsAnswer(BaseModel):
    role: Literal["primary", "replica"]
    epoch: int
    epochs: list[list[int]] = Field(description="[[epoch, start_offset], ...] ascending")
    log_end: int
    min_offset: int


class FetchAnswer(BaseModel):
    data: str = Field(description="whole records from `from` (raw bytes in msgpack, base64 "
                                  "in JSON); empty when nothing arrived in wait_ms")
    epoch: int
    epochs: list[list[int]]
    hwm: int = Field(description="high-water mark: records below it are held by min_insync "
                                 "copies")
    log_end: int
    min_offset: int
    meta_version: str = Field(description="changes whenever the topic table changes")
    segment_bytes: int
    floors: dict[str, int] = Field(description="retention floors (owner → physical offset): "
                                               "a replica keeps what its primary keeps")


class LogAnswer(BaseModel):
    data: str = Field(description="raw bytes (msgpack) or base64 (JSON)")
    next: int = Field(description="offset after the bytes returned")
    log_end: int
    min_offset: int


class TopicEntry(BaseModel):
    name: str
    queues: int
    perm: str


class MetadataAnswer(BaseModel):
    version: str
    topics: list[TopicEntry]


class StatusAnswer(BaseModel):
    enabled: bool = Field(description="false without replication (replicas = 1)")
    role: Literal["primary", "replica"]
    epoch: int
    primary_address: str | None
    deposed: bool
    last_offset: int
    epochs: list[list[int]]
    pid: int = Field(description="this broker's process id (a restart changes it)")
    model_config = {"extra": "allow"}


class RestartBody(StrictBody):
    pid: StrictInt = Field(ge=1, description="the process to stop: the `pid` of this broker's "
                                             "status (another one is refused)")


class RestartAnswer(BaseModel):
    restarting: bool
    pid: int = Field(description="the process that stops (its successor has another pid)")


class RoleBody(StrictBody):
    role: Literal["primary", "replica"]
    epoch: StrictInt = Field(ge=0, le=INT64_MAX)
    primary_address: str = Field("", max_length=2048,
                                 description="the primary to follow (role replica)")


def _refused(exc: FetchRefused) -> Response:
    return error_response(REFUSAL_CODES[exc.reason], exc.message, headers={H_REASON: exc.reason})


@router.get("/fetch", summary="A replica fetches raw log bytes from its end (long poll)",
            response_model=FetchAnswer,
            responses=errors(ErrorCode.OFFSET_OUT_OF_RANGE, ErrorCode.NOT_PRIMARY))
async def fetch(
    request: Request,
    start: LogOffset,
    broker_id: Annotated[int, Query(ge=0, le=1023, description="the replica's broker_id")],
    address: Annotated[str, Query(max_length=2048, description="the replica's base URL")] = "",
    flushed: Annotated[int, Query(ge=0, le=INT64_MAX, description="the replica fsynced "
                                  "everything below this offset")] = 0,
    epoch: Annotated[int, Query(ge=0, le=INT64_MAX, description="the replica's epoch")] = 0,
    wait_ms: Annotated[int, Query(ge=0, le=LONG_POLL_MAX_MS)] = 0,
    max_bytes: MaxBytes = 4 * 1024 * 1024,
    hwm: Annotated[int, Query(ge=-1, le=INT64_MAX, description="the high-water mark the "
                              "replica knows: the fetch is held only while nothing is newer")
                   ] = -1,
) -> Response:
    repl = broker_of(request).replication
    try:
        got = await repl.source.fetch(broker_id, address, start, flushed, epoch, wait_ms / 1000,
                                      max_bytes, hwm)
    except FetchRefused as exc:
        return _refused(exc)
    if wants_chunk(request.headers.get("accept")):
        return Response(got.data, media_type=CONTENT_CHUNK, headers=chunk_headers(
            got.epoch, got.hwm, got.log_end, got.min_offset, got.segment_bytes,
            got.meta_version, got.epochs, got.floors))
    return reply(request, {
        "data": got.data, "epoch": got.epoch, "epochs": got.epochs, "hwm": got.hwm,
        "log_end": got.log_end, "min_offset": got.min_offset, "meta_version": got.meta_version,
        "segment_bytes": got.segment_bytes, "floors": got.floors})


@router.get("/log", summary="Raw commit log bytes from an offset (acknowledges nothing)",
            response_model=LogAnswer, responses=errors(ErrorCode.OFFSET_OUT_OF_RANGE))
async def read_log(request: Request, start: LogOffset,
                   max_bytes: MaxBytes = 1024 * 1024) -> Response:
    store = broker_of(request).store
    if start > store.log.write_offset or start < store.log.min_offset:
        raise ProtocolError(ErrorCode.OFFSET_OUT_OF_RANGE, f"offset {start} is outside the log "
                            f"[{store.log.min_offset}, {store.log.write_offset}]")
    try:
        data = store.read_chunk(start, max_bytes)
    except ChunkError as exc:
        raise ProtocolError(ErrorCode.OFFSET_OUT_OF_RANGE, str(exc)) from exc
    clog = store.log
    nxt = start + len(data)
    i = clog._segment_index(start)
    if i is not None and i + 1 < len(clog.segments):
        seg = clog.segments[i]
        if nxt == seg.start + seg.length:  # the segment is sealed: the next one follows
            nxt = clog.segments[i + 1].start
    return reply(request, {"data": data, "next": nxt, "log_end": clog.write_offset,
                           "min_offset": clog.min_offset})


@router.get("/epochs", summary="This broker's epoch history and log bounds",
            response_model=EpochsAnswer)
async def epochs(request: Request) -> Response:
    broker = broker_of(request)
    return reply(request, {"role": broker.role.role.value, "epoch": broker.role.epoch,
                           "epochs": broker.role.epochs.to_wire(),
                           "log_end": broker.store.log.write_offset,
                           "min_offset": broker.store.log.min_offset})


@router.get("/metadata", summary="The topic table a replica copies", response_model=MetadataAnswer)
async def metadata(request: Request) -> Response:
    return reply(request, broker_of(request).replication.metadata())


@router.get("/status", summary="Replication state: role, epoch, HWM, replicas, lag",
            response_model=StatusAnswer)
async def status(request: Request) -> Response:
    broker = broker_of(request)
    answer: dict[str, Any] = {"enabled": broker.settings.replicated,
                              **broker.replication.status(), "pid": os.getpid()}
    return reply(request, answer)


@router.post("/restart", summary="Stop this broker cleanly for its supervisor to start it again",
             openapi_extra=body_doc(RestartBody), response_model=RestartAnswer,
             status_code=202, responses=errors(ErrorCode.BAD_REQUEST))
async def restart(request: Request) -> Response:
    body = await read_model(request, RestartBody)
    pid = os.getpid()
    if body.pid != pid:
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"this broker's process is {pid}, not "
                            f"{body.pid} (restarted already?): nothing stops")
    if not getattr(request.app.state, "own_process", False):
        raise ProtocolError(ErrorCode.BAD_REQUEST, "this broker runs inside another program "
                            "(not `python -m tidemq_server.broker`): it cannot stop its process")
    asyncio.get_running_loop().call_later(RESTART_AFTER_S, os.kill, pid, signal.SIGTERM)
    return reply(request, {"restarting": True, "pid": pid}, status=202)


@router.post("/role", openapi_extra=body_doc(RoleBody),
             summary="Promote (role primary) or demote (role replica) this broker",
             response_model=StatusAnswer, responses=errors(ErrorCode.BAD_REQUEST))
async def change_role(request: Request) -> Response:
    broker = broker_of(request)
    body = await read_model(request, RoleBody)
    role = broker.role
    unchanged = body.role == role.role.value and body.epoch == role.epoch
    if not broker.settings.replicated and not unchanged:
        raise ProtocolError(ErrorCode.BAD_REQUEST, "replication is off on this broker "
                            "(TIDEMQ_BROKER_REPLICAS=1): its role cannot change")
    try:
        if body.role == Role.PRIMARY:
            await role.promote(body.epoch)
        elif not unchanged or body.primary_address.rstrip("/") != role.primary_address:
            if not body.primary_address:
                raise ProtocolError(ErrorCode.BAD_REQUEST, "role replica needs primary_address")
            await role.demote(body.primary_address, body.epoch)
    except StaleEpochError as exc:
        raise ProtocolError(ErrorCode.BAD_REQUEST, str(exc)) from exc
    answer: dict[str, Any] = {"enabled": broker.settings.replicated,
                              **broker.replication.status(), "pid": os.getpid()}
    return reply(request, answer)

