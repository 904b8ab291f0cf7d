"""QueryRoute and QueryAssignment: where a topic's queues are, and what a consumer reads.

A route lists the topic's queues on every broker group, each with its permission, the message
types the brokers accept (NORMAL, FIFO and DELAY always; TRANSACTION unless this broker rejects
transactional messages) and the gRPC endpoint of the group that holds it. This broker's own
queues come from its own topic table; the other groups' from the nameservers' cluster view
(``GET /v1/cluster``: each group's topics and ``grpc_address``, cached for
``GRPC_ROUTE_CACHE_S``). A group without a gRPC address is left out: clients could not reach it.
Without nameservers a route lists this broker alone. A replica's door (replicated groups) lists
its group's primary instead of itself, so clients follow a failover.

Consumers receive from a whole topic on a broker (the simple consumer semantics of docs/api.md),
so an assignment is one queue per group with id -1, as RocketMQ 5's proxy answers for pop
consumption; each group's door serves its own queues only (``Door.require_own``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from tidemq.protocol import Perm, is_system_topic, validate_group_name

from tidemq_server.broker.grpc.door import Door, endpoints_of, split_address
from tidemq_server.broker.grpc.errors import error_status
from tidemq_server.broker.grpc.proto import MessageType, Permission, ok, pb, service_pb
from tidemq_server.broker.messaging.topics import TopicConfig
from tidemq_server.common.discovery import Group

log = logging.getLogger(__name__)

PERMISSIONS = {Perm.READ_WRITE: Permission.READ_WRITE, Perm.READ: Permission.READ,
               Perm.WRITE: Permission.WRITE}
WHOLE_TOPIC = -1  # queue id of an assignment: every queue of the topic on one broker


@dataclass(frozen=True, slots=True)
class Share:
    """One group's queues of a topic."""

    broker_name: str
    endpoints: Any  # pb.Endpoints of the group's gRPC door
    queues: int
    perm: Perm
    system: bool


def accepted_types(door: Door) -> list[int]:
    """The message types this broker stores."""
    broker = door.broker
    kinds = [MessageType.NORMAL, MessageType.FIFO, MessageType.DELAY]
    transactions = getattr(broker, "transactions", None)
    if transactions is not None and not broker.settings.reject_transactions:
        kinds.append(MessageType.TRANSACTION)
    return [int(k) for k in kinds]


def message_queue(share: Share, topic: str, queue_id: int, kinds: list[int]) -> Any:
    queue = pb.MessageQueue(id=queue_id)
    queue.topic.name = topic
    queue.permission = Permission.READ if share.system else PERMISSIONS[share.perm]
    queue.broker.name = share.broker_name
    queue.broker.id = 0  # the primary: one broker process per group
    queue.broker.endpoints.CopyFrom(share.endpoints)
    queue.accept_message_types.extend(kinds)
    return queue


async def topic_config(door: Door, topic: str) -> TopicConfig:
    """The topic, created first when the broker auto-creates topics on send."""
    broker = door.broker
    cfg = broker.topics.get(topic)
    if cfg is None and broker.settings.auto_create_topics:
        return await broker.sender.writable_topic(topic)
    return broker.topics.require(topic)


async def other_groups(door: Door) -> list[Group]:
    """Every other broker group the nameservers list (none without nameservers)."""
    if door.cluster is None:
        return []
    own = door.broker.settings.broker_name
    groups = await door.cluster.groups()
    return [g for name, g in sorted(groups.items()) if name != own]


def remote_share(group: Group, topic: str) -> Share | None:
    """``group``'s queues of ``topic`` from its cluster entry; None when it has none or no
    gRPC door."""
    info = (group.topics or {}).get(topic)
    if not info or not group.grpc_address:
        return None
    try:
        host, port = split_address(group.grpc_address)
        queues, perm = int(info["queues"]), Perm(str(info["perm"]))
        if port <= 0 or queues <= 0:
            raise ValueError(f"port {port}, {queues} queues")
    except (KeyError, TypeError, ValueError) as exc:
        log.debug("group %s: unusable cluster entry for %s: %s", group.broker_name, topic, exc)
        return None
    return Share(group.broker_name, endpoints_of(host, port), queues, perm,
                 is_system_topic(topic))


async def shares(door: Door, topic: str) -> list[Share]:
    """The topic's queues on every group, this broker's first. A topic this broker does not
    have is created here only when it auto-creates topics; with no group holding it the
    answer is TOPIC_NOT_FOUND."""
    remote = [s for g in await other_groups(door) if (s := remote_share(g, topic))]
    broker = door.broker
    if door.cluster is not None and not broker.role.is_primary:
        # a replica's door sends clients to its group's primary, as the nameservers name it
        primary = (await door.cluster.groups()).get(broker.settings.broker_name)
        own_share = remote_share(primary, topic) if primary is not None else None
        if own_share is not None:
            return [own_share, *remote]
    if broker.topics.get(topic) is None and remote and not broker.settings.auto_create_topics:
        return remote
    cfg = await topic_config(door, topic)
    own = Share(broker.settings.broker_name, door.endpoints(), cfg.queues, cfg.perm, cfg.system)
    return [own, *remote]


async def query_route(door: Door, request: Any) -> Any:
    topic = request.topic.name
    try:
        kinds = accepted_types(door)
        queues = [message_queue(s, topic, q, kinds)
                  for s in await shares(door, topic) for q in range(s.queues)]
    except Exception as exc:
        return service_pb.QueryRouteResponse(status=error_status(exc, "QueryRoute"))
    return service_pb.QueryRouteResponse(status=ok(), message_queues=queues)


async def query_assignment(door: Door, request: Any) -> Any:
    topic = request.topic.name
    try:
        validate_group_name(request.group.name)
        kinds = accepted_types(door)
        readable = [s for s in await shares(door, topic) if s.perm.readable]
    except Exception as exc:
        return service_pb.QueryAssignmentResponse(status=error_status(exc, "QueryAssignment"))
    assignments = []
    for share in readable:
        assignment = pb.Assignment()
        assignment.message_queue.CopyFrom(message_queue(share, topic, WHOLE_TOPIC, kinds))
        assignments.append(assignment)
    return service_pb.QueryAssignmentResponse(status=ok(), assignments=assignments)
