"""The gRPC door's ACL: RocketMQ 5 signatures (``MQv2-HMAC-SHA1``) and what each RPC needs.

The official clients sign every call with ``authorization`` and ``x-mq-date-time`` metadata
(``Credentials(ak, sk)``). A refused call is answered the RocketMQ way, with a ``Status`` in its
response: ``Code.UNAUTHORIZED`` (no or bad signature) or ``Code.FORBIDDEN`` naming the resource
and action, which the clients raise as ``UnauthorizedException`` / ``ForbiddenException``. A
Telemetry stream, which has no such answer, ends with gRPC status UNAUTHENTICATED /
PERMISSION_DENIED.
"""

from __future__ import annotations

from typing import Any

import grpc
from tidemq.protocol import ErrorCode
from tidemq.protocol.signing import GRPC_DATE_HEADER

from tidemq_server.broker.grpc.door import Door
from tidemq_server.broker.grpc.proto import Code, status
from tidemq_server.common.auth import Gate, Need, Refused, Resource
from tidemq_server.common.auth.gate import topic_need

ANY = ("pub", "sub", "admin")
CONSUMER_TYPES = frozenset({2, 3})  # ClientType PUSH_CONSUMER, SIMPLE_CONSUMER


def topic(name: str, actions: tuple[str, ...]) -> Need:
    return topic_need(name, actions)  # %RETRY%G and %DLQ%G: the group's


def group(name: str) -> Need:
    return Need(Resource("group", name), ("sub",))


def consumer(request: Any, topic_name: str) -> list[Need]:
    """A consumer's call: its group and the topic it reads."""
    return [group(request.group.name), topic(topic_name, ("sub",))]


def needs_of(rpc: str, request: Any) -> list[Need]:
    """What ``rpc`` needs for ``request`` (docs/api.md, "gRPC door")."""
    if rpc == "QueryRoute":
        return [topic(request.topic.name, ANY)]
    if rpc == "QueryAssignment":
        return consumer(request, request.topic.name)
    if rpc in ("Heartbeat", "NotifyClientTermination"):
        if request.HasField("group") and int(request.client_type) in CONSUMER_TYPES:
            return [group(request.group.name)]
        return []
    if rpc == "SendMessage":
        names = sorted({m.topic.name for m in request.messages})
        return [topic(n, ("pub",)) for n in names]
    if rpc in ("EndTransaction", "RecallMessage"):
        return [topic(request.topic.name, ("pub",))]
    if rpc == "ReceiveMessage":
        return consumer(request, request.message_queue.topic.name)
    if rpc in ("AckMessage", "ChangeInvisibleDuration", "ForwardMessageToDeadLetterQueue"):
        return consumer(request, request.topic.name)
    return [Need(Resource("cluster"), ("admin",))]


class GrpcGuard:
    def __init__(self, gate: Gate) -> None:
        self.gate = gate

    def refusal(self, rpc: str, context: grpc.aio.ServicerContext, request: Any) -> Refused | None:
        """Why this call is refused, or None when it may go on."""
        metadata = {k: v for k, v in context.invocation_metadata() or ()
                    if isinstance(v, str)}
        try:
            user = self.gate.verify_grpc(metadata.get("authorization", ""),
                                        metadata.get(GRPC_DATE_HEADER, ""), rpc)
            self.gate.authorize("grpc", user, needs_of(rpc, request) if request is not None
                                else [], rpc)
        except Refused as refused:
            return refused
        return None

    @staticmethod
    def status_of(refused: Refused) -> Any:
        code = Code.FORBIDDEN if refused.code == ErrorCode.FORBIDDEN else Code.UNAUTHORIZED
        return status(code, f"{refused.code.value}: {refused.message}")

    @staticmethod
    def grpc_code(refused: Refused) -> grpc.StatusCode:
        return (grpc.StatusCode.PERMISSION_DENIED if refused.code == ErrorCode.FORBIDDEN
                else grpc.StatusCode.UNAUTHENTICATED)


def foreign_transaction(door: Door, request: Any) -> Any | None:
    """A FORBIDDEN ``Status`` when an EndTransaction names a topic other than its transaction's
    (rights were checked on the named topic); None when they agree or the id is unknown (the
    end itself then answers)."""
    service = getattr(door.broker, "transactions", None)
    info = service.table.ensure(request.transaction_id) if service is not None else None
    if info is None or info.topic == request.topic.name:
        return None
    return status(Code.FORBIDDEN, f"{ErrorCode.FORBIDDEN.value}: transaction "
                                  f"{request.transaction_id} is not of topic "
                                  f"{request.topic.name!r}")
