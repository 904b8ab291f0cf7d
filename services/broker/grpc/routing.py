"""QueryRoute and QueryAssignment: where a topic's queues are, and what a consumer reads.

A route lists the topic's queues on this broker, each with its permission, the message types
the broker accepts (NORMAL, FIFO and DELAY always; TRANSACTION unless the broker rejects
transactional messages) and the gRPC endpoint clients reach this broker at. Consumers receive
from a whole topic on a broker (the simple consumer semantics of docs/api.md), so an assignment is
one queue per broker with id -1, as RocketMQ 5's proxy answers for pop consumption.
"""

from __future__ import annotations

import logging
from typing import Any

from tidemq.protocol import Perm, validate_group_name

from services.broker.grpc.door import Door
from services.broker.grpc.errors import error_status
from services.broker.grpc.proto import MessageType, Permission, ok, pb, service_pb
from services.broker.messaging.topics import TopicConfig

log = logging.getLogger(__name__)

PERMISSIONS = {Perm.READ_WRITE: Permission.READ_WRITE, Perm.READ: Permission.READ,
               Perm.WRITE: Permission.WRITE}
WHOLE_TOPIC = -1  # queue id of an assignment: every queue of the topic on this broker


def accepted_types(door: Door) -> list[int]:
    """The message types this broker stores."""
    broker = door.broker
    kinds = [MessageType.NORMAL, MessageType.FIFO, MessageType.DELAY]
    transactions = getattr(broker, "transactions", None)
    if transactions is not None and not broker.settings.reject_transactions:
        kinds.append(MessageType.TRANSACTION)
    return [int(k) for k in kinds]


def message_queue(door: Door, cfg: TopicConfig, queue_id: int, kinds: list[int]) -> Any:
    queue = pb.MessageQueue(id=queue_id)
    queue.topic.name = cfg.name
    queue.permission = Permission.READ if cfg.system else PERMISSIONS[cfg.perm]
    queue.broker.name = door.broker.settings.broker_name
    queue.broker.id = 0  # the master: tidemq has one broker per broker name
    queue.broker.endpoints.CopyFrom(door.endpoints())
    queue.accept_message_types.extend(kinds)
    return queue


async def topic_config(door: Door, topic: str) -> TopicConfig:
    """The topic, created first when the broker auto-creates topics on send."""
    broker = door.broker
    cfg = broker.topics.get(topic)
    if cfg is None and broker.settings.auto_create_topics:
        return await broker.sender.writable_topic(topic)
    return broker.topics.require(topic)


async def query_route(door: Door, request: Any) -> Any:
    try:
        cfg = await topic_config(door, request.topic.name)
        kinds = accepted_types(door)
        queues = [message_queue(door, cfg, q, kinds) for q in range(cfg.queues)]
    except Exception as exc:
        return service_pb.QueryRouteResponse(status=error_status(exc, "QueryRoute"))
    return service_pb.QueryRouteResponse(status=ok(), message_queues=queues)


async def query_assignment(door: Door, request: Any) -> Any:
    try:
        validate_group_name(request.group.name)
        cfg = await topic_config(door, request.topic.name)
        queue = message_queue(door, cfg, WHOLE_TOPIC, accepted_types(door))
    except Exception as exc:
        return service_pb.QueryAssignmentResponse(status=error_status(exc, "QueryAssignment"))
    if not cfg.perm.readable:
        return service_pb.QueryAssignmentResponse(status=ok())
    assignment = pb.Assignment()
    assignment.message_queue.CopyFrom(queue)
    return service_pb.QueryAssignmentResponse(status=ok(), assignments=[assignment])
