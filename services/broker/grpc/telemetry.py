"""Telemetry, Heartbeat and NotifyClientTermination: the client's session with the broker.

Telemetry is a two-way stream a client keeps open per broker. It reports its settings on it;
the broker answers with ``server_settings`` (the pitfall: a producer copies ``max_body_size``
from the answer, so it must never be 0) and later pushes commands on it: a
``RecoverOrphanedTransactionCommand`` when a transaction check is handed to this producer.
Heartbeat keeps the client in the broker's consumer group registry (with the subscriptions of
its settings) or producer registry (one producer group per published topic), as the REST
heartbeats do; NotifyClientTermination leaves them at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from tidemq.protocol import validate_group_name

from tidemq_server.broker.grpc import orphans
from tidemq_server.broker.grpc.door import Door, client_id_of
from tidemq_server.broker.grpc.errors import error_status
from tidemq_server.broker.grpc.proto import ok, service_pb
from tidemq_server.broker.grpc.sessions import Session, server_settings

log = logging.getLogger(__name__)

CLOSE = object()  # put into an outbox: the broker ends that Telemetry stream
ENDED = object()  # put into an outbox: the client ended its side of the stream
EXPIRE_EVERY_S = 10.0  # sweep silent sessions at most this often


def register(door: Door, session: Session, group: str | None = None) -> None:
    """Record a heartbeat of ``session`` with the broker's registries."""
    if session.is_consumer:
        group = group or session.group
        if group:
            door.broker.consumers.heartbeat(group, session.client_id, session.subscriptions,
                                            "clustering")
    elif session.is_producer:
        service = getattr(door.broker, "transactions", None)  # wakes its check pollers too
        beat = service.heartbeat if service is not None else door.broker.producers.heartbeat
        for topic in session.topics:
            beat(validate_group_name(topic), session.client_id)


async def heartbeat(door: Door, request: Any, context: grpc.aio.ServicerContext) -> Any:
    try:
        session = door.sessions.touch(client_id_of(context))
        if request.client_type and not session.client_type:
            session.client_type = int(request.client_type)
        group = request.group.name if request.HasField("group") else None
        register(door, session, group)
        _sweep(door)
    except Exception as exc:
        return service_pb.HeartbeatResponse(status=error_status(exc, "Heartbeat"))
    return service_pb.HeartbeatResponse(status=ok())


def _sweep(door: Door) -> None:
    now = door.sessions.clock()
    if now - door.swept_at < EXPIRE_EVERY_S:
        return
    door.swept_at = now
    for gone in door.sessions.expire():
        log.info("gRPC client %s silent for %.0fs: session dropped", gone.client_id,
                 door.sessions.expiry_s)


async def notify_termination(door: Door, request: Any,
                             context: grpc.aio.ServicerContext) -> Any:
    try:
        client_id = client_id_of(context)
        session = door.sessions.remove(client_id)
        group = request.group.name if request.HasField("group") else None
        group = group or (session.group if session else None)
        if group:
            door.broker.consumers.leave(group, client_id)
        service = getattr(door.broker, "transactions", None)  # wakes its check pollers too
        leave = service.leave if service is not None else door.broker.producers.leave
        for topic in session.topics if session else ():
            leave(topic, client_id)
    except Exception as exc:
        return service_pb.NotifyClientTerminationResponse(
            status=error_status(exc, "NotifyClientTermination"))
    log.info("gRPC client %s terminated", client_id)
    return service_pb.NotifyClientTerminationResponse(status=ok())


async def telemetry(door: Door, requests: AsyncIterator[Any],
                    context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
    try:
        client_id = client_id_of(context)
    except Exception as exc:
        yield service_pb.TelemetryCommand(status=error_status(exc, "Telemetry"))
        return
    session = door.sessions.touch(client_id)
    outbox: asyncio.Queue[Any] = asyncio.Queue()
    if session.outbox is not None:
        session.outbox.put_nowait(CLOSE)  # a rebuilt stream replaces the previous one
    session.outbox = outbox
    reader = asyncio.create_task(_read(door, session, requests, outbox))
    try:
        while True:
            item = await outbox.get()
            if item is CLOSE:
                break
            if item is ENDED:
                return
            yield item
        # ended by the broker (shutdown, a newer stream): a status, which clients log calmly
        await context.abort(grpc.StatusCode.UNAVAILABLE, "telemetry stream closed by the broker")
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        if session.outbox is outbox:
            session.outbox = None
            orphans.stop(session)


async def _read(door: Door, session: Session, requests: AsyncIterator[Any],
                outbox: asyncio.Queue[Any]) -> None:
    """Answer the client's settings; ignore its reports; close the stream when it ends."""
    try:
        async for command in requests:
            kind = command.WhichOneof("command")
            if kind != "settings":
                log.debug("gRPC client %s reported %s (ignored)", session.client_id, kind)
                continue
            door.sessions.apply_settings(session, command.settings)
            try:
                register(door, session)
                reply = service_pb.TelemetryCommand(
                    status=ok(), settings=server_settings(command.settings, door.side))
            except Exception as exc:
                reply = service_pb.TelemetryCommand(status=error_status(exc, "Telemetry"))
            outbox.put_nowait(reply)
            orphans.restart(door, session)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the client went away mid-read
        log.debug("gRPC client %s telemetry stream ended: %s", session.client_id, exc)
    outbox.put_nowait(ENDED)
