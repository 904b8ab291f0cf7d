"""``apache.rocketmq.v2.MessagingService``: each RPC dispatched to its handler function.

With ACL on (``guard``), each call is first checked (``tidemq_server.broker.grpc.auth``); a refused
call is answered with its ``Status`` and never reaches the handler.

RPCs tidemq does not serve (PullMessage, UpdateOffset, GetOffset, QueryOffset,
SyncLiteSubscription) keep the generated base class's answer: gRPC status UNIMPLEMENTED.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from grpc.aio import ServicerContext as Context

from tidemq_server.broker.grpc import consuming, producing, routing, telemetry
from tidemq_server.broker.grpc.auth import GrpcGuard, foreign_transaction
from tidemq_server.broker.grpc.door import Door
from tidemq_server.broker.grpc.proto import service_grpc, service_pb


class MessagingServicer(service_grpc.MessagingServiceServicer):
    def __init__(self, door: Door, guard: GrpcGuard | None = None) -> None:
        self.door = door
        self.guard = guard

    def _refused(self, rpc: str, request: Any, context: Context, answer: Any) -> Any | None:
        """The response refusing this call (ACL on), or None when it may go on."""
        if self.guard is None:
            return None
        refused = self.guard.refusal(rpc, context, request)
        return None if refused is None else answer(status=GrpcGuard.status_of(refused))

    async def QueryRoute(self, request: Any, context: Context) -> Any:
        return (self._refused("QueryRoute", request, context, service_pb.QueryRouteResponse)
                or await routing.query_route(self.door, request))

    async def QueryAssignment(self, request: Any, context: Context) -> Any:
        return (self._refused("QueryAssignment", request, context,
                              service_pb.QueryAssignmentResponse)
                or await routing.query_assignment(self.door, request))

    async def Heartbeat(self, request: Any, context: Context) -> Any:
        return (self._refused("Heartbeat", request, context, service_pb.HeartbeatResponse)
                or await telemetry.heartbeat(self.door, request, context))

    async def NotifyClientTermination(self, request: Any, context: Context) -> Any:
        return (self._refused("NotifyClientTermination", request, context,
                              service_pb.NotifyClientTerminationResponse)
                or await telemetry.notify_termination(self.door, request, context))

    async def Telemetry(self, request_iterator: AsyncIterator[Any],
                        context: Context) -> AsyncIterator[Any]:
        if self.guard is not None:
            refused = self.guard.refusal("Telemetry", context, None)
            if refused is not None:
                await context.abort(GrpcGuard.grpc_code(refused),
                                    f"{refused.code.value}: {refused.message}")
        async for command in telemetry.telemetry(self.door, request_iterator, context):
            yield command

    async def SendMessage(self, request: Any, context: Context) -> Any:
        return (self._refused("SendMessage", request, context, service_pb.SendMessageResponse)
                or await producing.send_message(self.door, request, context))

    async def EndTransaction(self, request: Any, context: Context) -> Any:
        refusal = self._refused("EndTransaction", request, context,
                                service_pb.EndTransactionResponse)
        if refusal is None and self.guard is not None:
            # the rights were checked on the topic the request names: it must be the
            # transaction's own (REST names the producer group, which the broker compares)
            other = foreign_transaction(self.door, request)
            if other is not None:
                refusal = service_pb.EndTransactionResponse(status=other)
        return refusal or await producing.end_transaction(self.door, request)

    async def RecallMessage(self, request: Any, context: Context) -> Any:
        return (self._refused("RecallMessage", request, context,
                              service_pb.RecallMessageResponse)
                or await producing.recall_message(self.door, request))

    async def ReceiveMessage(self, request: Any, context: Context) -> AsyncIterator[Any]:
        refusal = self._refused("ReceiveMessage", request, context,
                                service_pb.ReceiveMessageResponse)
        if refusal is not None:
            yield refusal
            return
        async for response in consuming.receive(self.door, request, context):
            yield response

    async def AckMessage(self, request: Any, context: Context) -> Any:
        return (self._refused("AckMessage", request, context, service_pb.AckMessageResponse)
                or await consuming.ack(self.door, request))

    async def ChangeInvisibleDuration(self, request: Any, context: Context) -> Any:
        return (self._refused("ChangeInvisibleDuration", request, context,
                              service_pb.ChangeInvisibleDurationResponse)
                or await consuming.change_invisible_duration(self.door, request))

    async def ForwardMessageToDeadLetterQueue(self, request: Any, context: Context) -> Any:
        return (self._refused("ForwardMessageToDeadLetterQueue", request, context,
                              service_pb.ForwardMessageToDeadLetterQueueResponse)
                or await consuming.forward_to_dlq(self.door, request))
