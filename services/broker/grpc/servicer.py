"""``apache.rocketmq.v2.MessagingService``: each RPC dispatched to its handler function.

RPCs tidemq does not serve (PullMessage, UpdateOffset, GetOffset, QueryOffset,
SyncLiteSubscription) keep the generated base class's answer: gRPC status UNIMPLEMENTED.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from grpc.aio import ServicerContext as Context

from services.broker.grpc import consuming, producing, routing, telemetry
from services.broker.grpc.door import Door
from services.broker.grpc.proto import service_grpc


class MessagingServicer(service_grpc.MessagingServiceServicer):
    def __init__(self, door: Door) -> None:
        self.door = door

    async def QueryRoute(self, request: Any, context: Context) -> Any:
        return await routing.query_route(self.door, request)

    async def QueryAssignment(self, request: Any, context: Context) -> Any:
        return await routing.query_assignment(self.door, request)

    async def Heartbeat(self, request: Any, context: Context) -> Any:
        return await telemetry.heartbeat(self.door, request, context)

    async def NotifyClientTermination(self, request: Any, context: Context) -> Any:
        return await telemetry.notify_termination(self.door, request, context)

    async def Telemetry(self, request_iterator: AsyncIterator[Any],
                        context: Context) -> AsyncIterator[Any]:
        async for command in telemetry.telemetry(self.door, request_iterator, context):
            yield command

    async def SendMessage(self, request: Any, context: Context) -> Any:
        return await producing.send_message(self.door, request, context)

    async def EndTransaction(self, request: Any, context: Context) -> Any:
        return await producing.end_transaction(self.door, request)

    async def RecallMessage(self, request: Any, context: Context) -> Any:
        return await producing.recall_message(self.door, request)

    async def ReceiveMessage(self, request: Any, context: Context) -> AsyncIterator[Any]:
        async for response in consuming.receive(self.door, request, context):
            yield response

    async def AckMessage(self, request: Any, context: Context) -> Any:
        return await consuming.ack(self.door, request)

    async def ChangeInvisibleDuration(self, request: Any, context: Context) -> Any:
        return await consuming.change_invisible_duration(self.door, request)

    async def ForwardMessageToDeadLetterQueue(self, request: Any, context: Context) -> Any:
        return await consuming.forward_to_dlq(self.door, request)
