"""ReceiveMessage, AckMessage, ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue.

RocketMQ 5's pop consumption is tidemq's simple consumer (docs/api.md
``/v1/groups/{group}/receive``, ``/ack``, ``/invisibility``): every call goes to
``broker.consumers`` exactly as the REST routes do. A receive serves the whole topic on this
broker (the queue in the request only chose the broker), waits up to the client's long polling
time (bounded by the call's deadline), and streams its status first, then the delivery time,
then the messages. ``delivery_attempt`` is one more than the deliveries before this one
(``reconsume_times``).

A message delivered more than ``max_reconsume_times`` times goes to the group's DLQ instead of
to the client (RocketMQ 5 clients leave that to the server), through ``broker.retries`` as a
forward to the DLQ does.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from tidemq.protocol import validate_group_name

from tidemq_server.broker.consumers.simple import MAX_RECEIVE, Received
from tidemq_server.broker.grpc.door import Door, client_id_of
from tidemq_server.broker.grpc.errors import RpcRefused, error_status
from tidemq_server.broker.grpc.messages import outbound
from tidemq_server.broker.grpc.proto import (
    Code,
    FilterType,
    duration_ms,
    ok,
    service_pb,
    set_timestamp,
    status,
)
from tidemq_server.common.clock import now_ms

log = logging.getLogger(__name__)

DEFAULT_BATCH = 32  # messages per receive when the client names no batch size
REPLY_MARGIN_MS = 1_000  # answer a held receive this long before the call's deadline


def tags_of(expression: Any) -> str:
    """A FilterExpression as a tag expression; SQL92 filters are refused."""
    if expression.type == FilterType.SQL:
        raise RpcRefused(Code.ILLEGAL_FILTER_EXPRESSION,
                         "SQL92 filters are not supported by tidemq; filter by tag")
    return expression.expression.strip() or "*"


def wait_ms_of(door: Door, request: Any, context: grpc.aio.ServicerContext) -> int:
    """How long a receive may be held: the client's long polling time, within its deadline."""
    if request.HasField("long_polling_timeout"):
        wait = duration_ms(request.long_polling_timeout)
    else:
        session = door.sessions.get(client_id_of(context, required=False))
        wait = (session.long_polling_ms if session and session.long_polling_ms
                else door.side.long_polling_ms)
    remaining = context.time_remaining()
    if remaining is not None:
        wait = min(wait, int(remaining * 1000) - REPLY_MARGIN_MS)
    return max(0, wait)


async def receive(door: Door, request: Any,
                  context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
    group = request.group.name
    topic = request.message_queue.topic.name
    try:
        door.require_own(request.message_queue)
        validate_group_name(group)
        tags = tags_of(request.filter_expression)
        batch = min(max(request.batch_size or DEFAULT_BATCH, 1), MAX_RECEIVE)
        invisible_ms = (duration_ms(request.invisible_duration)
                        if request.HasField("invisible_duration") else door.invisible_ms)
        wait_ms = 0 if door.closing else wait_ms_of(door, request, context)
        received = await door.broker.consumers.receive(group, topic, tags, batch, invisible_ms,
                                                       wait_ms)
        received = await _drop_dead(door, group, received)
    except Exception as exc:
        yield service_pb.ReceiveMessageResponse(status=error_status(exc, "ReceiveMessage"))
        return
    if not received:
        yield service_pb.ReceiveMessageResponse(
            status=status(Code.MESSAGE_NOT_FOUND, "no new message"))
        return
    yield service_pb.ReceiveMessageResponse(status=ok())
    delivered = service_pb.ReceiveMessageResponse()
    set_timestamp(delivered.delivery_timestamp, now_ms())
    yield delivered
    for item in received:
        visible_in = max(0, item.invisible_until_ms - now_ms())
        msg = outbound(item.record, topic=topic, receipt_handle=item.receipt_handle,
                       delivery_attempt=item.reconsume_times + 1, invisible_ms=visible_in)
        yield service_pb.ReceiveMessageResponse(message=msg)


async def _drop_dead(door: Door, group: str, received: list[Received]) -> list[Received]:
    """Move messages past the group's delivery limit to its DLQ; the others go to the client."""
    limit = door.side.max_reconsume_times
    alive = [r for r in received if r.reconsume_times <= limit]
    for item in received:
        if item.reconsume_times <= limit:
            continue
        message_id = item.record.message_id
        try:
            destination = await door.broker.retries.retry(group, message_id, dead_letter=True)
            await door.broker.consumers.ack(group, [item.receipt_handle])
        except Exception as exc:  # it stays in flight and is tried again when visible
            log.warning("group %s: moving message %s to the DLQ failed: %s", group, message_id,
                        exc)
            continue
        log.info("group %s: message %s delivered %d times (max %d), moved to %s", group,
                 message_id, item.reconsume_times, limit + 1, destination)
    return alive


async def ack(door: Door, request: Any) -> Any:
    group = request.group.name
    entries = []
    for entry in request.entries:
        try:
            acked = await door.broker.consumers.ack(group, [entry.receipt_handle])
            result = ok() if acked else status(
                Code.INVALID_RECEIPT_HANDLE,
                "receipt handle is acked, expired or superseded by a later delivery")
        except Exception as exc:
            result = error_status(exc, "AckMessage")
        entries.append(service_pb.AckMessageResultEntry(
            message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=result))
    return service_pb.AckMessageResponse(status=overall([e.status for e in entries]),
                                         entries=entries)


def overall(statuses: list[Any]) -> Any:
    """One status for a batch: the common one, or MULTIPLE_RESULTS."""
    codes = {s.code for s in statuses}
    if not codes:
        return ok()
    if len(codes) == 1:
        return statuses[0]
    return status(Code.MULTIPLE_RESULTS)


async def change_invisible_duration(door: Door, request: Any) -> Any:
    try:
        handle = await door.broker.consumers.change_invisibility(
            request.group.name, request.receipt_handle, duration_ms(request.invisible_duration))
    except Exception as exc:
        return service_pb.ChangeInvisibleDurationResponse(
            status=error_status(exc, "ChangeInvisibleDuration"))
    return service_pb.ChangeInvisibleDurationResponse(status=ok(), receipt_handle=handle)


async def forward_to_dlq(door: Door, request: Any) -> Any:
    """The client gave up on a message: it goes to ``%DLQ%group`` and its delivery is acked."""
    group = request.group.name
    try:
        validate_group_name(group)
        destination = await door.broker.retries.retry(group, request.message_id,
                                                      dead_letter=True)
        await door.broker.consumers.ack(group, [request.receipt_handle])
    except Exception as exc:
        return service_pb.ForwardMessageToDeadLetterQueueResponse(
            status=error_status(exc, "ForwardMessageToDeadLetterQueue"))
    log.info("group %s: message %s forwarded to %s by its client after %d attempt(s)", group,
             request.message_id, destination, request.delivery_attempt)
    return service_pb.ForwardMessageToDeadLetterQueueResponse(status=ok())
