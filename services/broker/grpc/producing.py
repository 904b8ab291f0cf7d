"""SendMessage, EndTransaction and RecallMessage.

A SendMessageRequest is one batch for one topic. NORMAL, FIFO and DELAY messages become the
docs/api.md wire Messages and go through ``broker.sender.send`` - the very call of ``POST
/v1/topics/{topic}/messages`` (validation, queue choice by sharding key, dedup by message id,
delay routing). TRANSACTION messages go to ``broker.transactions.begin`` (``POST
/v1/transactions``) as half messages of the producer group named like the topic (RocketMQ 5 has
no producer groups; its proxy uses the topic), with ``orphaned_transaction_recovery_duration``
as their check immunity. EndTransaction is ``broker.transactions.end``; RecallMessage cancels a
delayed message through ``broker.delays.cancel`` (the recall handle is the message id). The
official clients send RecallMessage to their access point, not to the group holding the message,
so a message this broker does not know is recalled on the other groups (``DELETE
/v1/messages/{id}/schedule`` of each, found through the nameservers).
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

import grpc
import httpx
from tidemq.protocol import ErrorCode, ProtocolError

from tidemq_server.broker.grpc.door import Door, peer_host
from tidemq_server.broker.grpc.errors import RpcRefused, error_status
from tidemq_server.broker.grpc.messages import DELAY, TRANSACTION, Inbound, inbound
from tidemq_server.broker.grpc.proto import (
    Code,
    TransactionResolution,
    TransactionSource,
    ok,
    service_pb,
)
from tidemq_server.broker.grpc.routing import other_groups
from tidemq_server.broker.transactions.service import TransactionService, parse_end
from tidemq_server.common.auth.client import service_auth
from tidemq_server.common.tls import client_context

log = logging.getLogger(__name__)

ACTIONS = {TransactionResolution.COMMIT: "commit", TransactionResolution.ROLLBACK: "rollback"}
RECALL_TIMEOUT_S = 10.0  # one recall forwarded to another group's REST API (s)

TRANSACTIONS_MISSING = ("transactional messages are not available on this tidemq broker "
                        "(it runs without the transaction service)")


async def send_message(door: Door, request: Any, context: grpc.aio.ServicerContext) -> Any:
    try:
        items = _inbound_batch(door, request)
        if items[0].kind == TRANSACTION:
            entries = await _send_half(door, items, peer_host(context))
        else:
            results = await door.broker.sender.send(
                items[0].topic, {"messages": [i.wire for i in items]}, peer_host(context))
            entries = [service_pb.SendResultEntry(status=ok(), message_id=r["message_id"],
                                                  offset=_offset(r),
                                                  recall_handle=_recall_handle(item, r))
                       for item, r in zip(items, results, strict=True)]
    except Exception as exc:
        return service_pb.SendMessageResponse(status=error_status(exc, "SendMessage"))
    return service_pb.SendMessageResponse(status=ok(), entries=entries)


def _inbound_batch(door: Door, request: Any) -> list[Inbound]:
    if not request.messages:
        raise RpcRefused(Code.BAD_REQUEST, "no message to send")
    limit = door.broker.settings.max_body_bytes
    items = [inbound(m, limit) for m in request.messages]
    topic, kind = items[0].topic, items[0].kind
    for item in items[1:]:
        if item.topic != topic:
            raise RpcRefused(Code.BAD_REQUEST, "every message of one send must have one topic")
        if (item.kind == TRANSACTION) != (kind == TRANSACTION):
            raise RpcRefused(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                             "transactional and other messages cannot be sent together")
    return items


def transactions_of(door: Door) -> TransactionService:
    service: TransactionService | None = getattr(door.broker, "transactions", None)
    if service is None:
        raise RpcRefused(Code.UNSUPPORTED, TRANSACTIONS_MISSING)
    return service


async def _send_half(door: Door, items: list[Inbound], host: str) -> list[Any]:
    """Half messages through ``TransactionService.begin`` (``POST /v1/transactions``), one
    request per check immunity (clients send one message per request anyway)."""
    service = transactions_of(door)
    topic = items[0].topic
    entries: list[Any] = []
    for immunity, batch in _by_immunity(items):
        payload: dict[str, Any] = {"producer_group": topic, "topic": topic,
                                   "messages": [i.wire for i in batch]}
        if immunity is not None:
            payload["check_immunity_s"] = immunity
        answer = await service.begin(payload, host)
        entries.extend(service_pb.SendResultEntry(status=ok(), message_id=r["message_id"],
                                                  transaction_id=r["transaction_id"])
                       for r in answer["transactions"])
    return entries


def _by_immunity(items: list[Inbound]) -> list[tuple[int | None, list[Inbound]]]:
    groups: dict[int | None, list[Inbound]] = {}
    for item in items:
        groups.setdefault(item.check_immunity_s, []).append(item)
    return list(groups.items())


async def end_transaction(door: Door, request: Any) -> Any:
    """COMMIT, ROLLBACK, or (UNSPECIFIED) unknown, through ``TransactionService.end`` as
    ``POST /v1/transactions/{id}/end``; a client's checker answers with SOURCE_SERVER_CHECK."""
    try:
        service = transactions_of(door)
        action = ACTIONS.get(request.resolution, "unknown")
        end = parse_end({"transaction_id": request.transaction_id, "action": action,
                         "from_check": request.source == TransactionSource.SOURCE_SERVER_CHECK})
        [result] = await service.end(None, [end])
    except Exception as exc:
        return service_pb.EndTransactionResponse(status=error_status(exc, "EndTransaction"))
    if "code" in result:
        refused = ProtocolError(ErrorCode(result["code"]), result["message"])
        return service_pb.EndTransactionResponse(status=error_status(refused, "EndTransaction"))
    return service_pb.EndTransactionResponse(status=ok())


def _offset(result: dict[str, Any]) -> int:
    """The queue offset of a send result; -1 for a delayed message, which has no position in
    its queue until it is delivered."""
    offset = result["queue_offset"]
    return -1 if offset is None else int(offset)


def _recall_handle(item: Inbound, result: dict[str, Any]) -> str:
    """A delayed message can be recalled (cancelled) by its id until it is delivered."""
    return str(result["message_id"]) if item.kind == DELAY else ""


async def recall_message(door: Door, request: Any) -> Any:
    """RecallMessage: cancel a delayed message not yet delivered, as ``DELETE
    /v1/messages/{message_id}/schedule?topic=`` does (the recall handle is the message id; the
    request's topic says which topic's message, as ids are unique per topic only)."""
    try:
        if not request.recall_handle:
            raise RpcRefused(Code.BAD_REQUEST, "recall_handle is empty")
        topic = request.topic.name or None
        try:
            answer = await door.broker.delays.cancel(request.recall_handle, topic)
        except ProtocolError as exc:
            if exc.code is not ErrorCode.MESSAGE_NOT_FOUND:
                raise
            answer = await _recall_elsewhere(door, request.recall_handle, topic, exc)
    except Exception as exc:
        return service_pb.RecallMessageResponse(status=error_status(exc, "RecallMessage"))
    return service_pb.RecallMessageResponse(status=ok(), message_id=answer["message_id"])


async def _recall_elsewhere(door: Door, message_id: str, topic: str | None,
                            not_here: ProtocolError) -> dict[str, Any]:
    """Cancel ``message_id`` on the group that holds it; ``not_here`` when no group does.
    A group that cannot be asked makes the answer UNAVAILABLE (it may hold the message)."""
    unreachable: list[str] = []
    async with httpx.AsyncClient(timeout=RECALL_TIMEOUT_S, verify=client_context(),
                                 auth=service_auth()) as http:
        for group in await other_groups(door):
            url = f"{group.address}/v1/messages/{quote(message_id, safe='')}/schedule"
            try:
                resp = await http.delete(url, headers={"accept": "application/json"},
                                         params={"topic": topic} if topic else {})
                answer = resp.json() if resp.content else {}
            except (httpx.HTTPError, ValueError) as exc:
                unreachable.append(f"{group.broker_name} ({type(exc).__name__})")
                continue
            if resp.status_code == 200:
                log.info("message %s recalled on broker %s", message_id, group.broker_name)
                return {"message_id": message_id, **answer}
            code = answer.get("code") if isinstance(answer, dict) else None
            if code == ErrorCode.MESSAGE_NOT_FOUND.value:
                continue
            try:
                error = ErrorCode(str(code))
            except ValueError:
                error = ErrorCode.UNAVAILABLE
            raise ProtocolError(error, f"broker {group.broker_name}: "
                                       f"{answer.get('message', resp.text[:200])}")
    if unreachable:
        raise ProtocolError(ErrorCode.UNAVAILABLE,
                            f"message {message_id!r} is not on this broker and "
                            f"{', '.join(unreachable)} cannot be asked now; retry")
    raise not_here
