"""Consumer group operations: membership, committed offsets, and the simple consumer.

Offsets live in Redis (``OffsetStore``); a commit is answered once Redis has it. Membership is
in memory (``GroupRegistry``). Receive, ack and invisibility are ``SimpleConsumerService``'s.
"""

from __future__ import annotations

from typing import Any

from tidemq.protocol import ErrorCode, ProtocolError, validate_group_name, validate_topic_name
from tidemq.protocol.tags import TagExpression

from tidemq_server.broker.consumers.membership import GroupRegistry
from tidemq_server.broker.consumers.offsets import OffsetStore
from tidemq_server.broker.consumers.simple import Received, SimpleConsumerService
from tidemq_server.broker.messaging.pull import PullService
from tidemq_server.broker.messaging.topics import TopicManager
from tidemq_server.broker.store.store import MessageStore

MAX_OFFSETS_PER_COMMIT = 65_536  # entries in one PUT /offsets


class ConsumerService:
    def __init__(self, store: MessageStore, topics: TopicManager, groups: GroupRegistry,
                 offsets: OffsetStore, simple: SimpleConsumerService, pulls: PullService,
                 long_poll_max_ms: int) -> None:
        self.store = store
        self.topics = topics
        self.groups = groups
        self.offsets = offsets
        self.simple = simple
        self.pulls = pulls
        self.long_poll_max_ms = long_poll_max_ms

    # --- membership ------------------------------------------------------------------------------

    def heartbeat(self, group: str, client_id: str, subscriptions: dict[str, str],
                  mode: str) -> list[str]:
        """A member's heartbeat. Every subscribed topic name and tag expression must be valid
        (400 naming it); a topic this broker does not have is kept (it may live on another
        broker group, or be created later) but not listed by ``known_groups``."""
        validate_group_name(group)
        for topic, expression in subscriptions.items():
            validate_topic_name(topic)
            TagExpression.parse(expression, f"subscriptions[{topic!r}]")
        return self.groups.heartbeat(group, client_id, subscriptions, mode)

    def leave(self, group: str, client_id: str) -> None:
        validate_group_name(group)
        self.groups.leave(group, client_id)

    # --- offsets ---------------------------------------------------------------------------------

    async def commit(self, group: str, entries: list[tuple[str, int, int]], *,
                     advance_only: bool = False) -> None:
        """Store committed offsets once each is known to be within its queue (``advance_only``:
        never lower a stored offset)."""
        validate_group_name(group)
        if len(entries) > MAX_OFFSETS_PER_COMMIT:
            raise ProtocolError(ErrorCode.MESSAGE_TOO_LARGE,
                                f"{len(entries)} offsets in one commit; at most "
                                f"{MAX_OFFSETS_PER_COMMIT}")
        for topic, queue_id, offset in entries:
            cfg = self.topics.require(topic)
            if queue_id < 0 or queue_id >= cfg.queues:
                raise ProtocolError(ErrorCode.BAD_REQUEST,
                                    f"queue_id {queue_id} does not exist: topic {topic!r} has "
                                    f"queues 0-{cfg.queues - 1}")
            if offset < 0:
                raise ProtocolError(ErrorCode.BAD_REQUEST,
                                    f"offset {offset} for {topic} queue {queue_id} must be >= 0")
            _, high = self.store.queue_offsets(topic, queue_id)
            if offset > high:
                raise ProtocolError(ErrorCode.OFFSET_OUT_OF_RANGE,
                                    f"offset {offset} for {topic} queue {queue_id} is beyond its "
                                    f"max_offset {high}")
        await self.offsets.commit(group, entries, advance_only=advance_only)

    async def committed(self, group: str, topic: str | None) -> list[dict[str, Any]]:
        """Committed offsets with the queue end and lag ([] for an unknown group)."""
        validate_group_name(group)
        topics = [topic] if topic else await self.offsets.topics(group)
        out: list[dict[str, Any]] = []
        for name, committed in zip(topics, await self.offsets.get_many(group, topics),
                                   strict=True):
            for queue_id in sorted(committed):
                offset = committed[queue_id]
                _, high = self.store.queue_offsets(name, queue_id)
                out.append({"topic": name, "queue_id": queue_id, "offset": offset,
                            "max_offset": high, "lag": max(0, high - offset)})
        return out

    async def known_groups(self) -> list[dict[str, Any]]:
        """Consumer groups this broker knows: those with live members (in memory) and those
        with committed offsets (Redis), each with its members, mode, subscriptions and the
        topics it subscribes to or has offsets for; sorted by group."""
        committed = await self.offsets.groups()
        out: list[dict[str, Any]] = []
        for group in sorted(set(self.groups.groups()) | set(committed)):
            subscriptions = {t: e for t, e in self.groups.subscriptions(group).items()
                             if self.topics.get(t) is not None}
            out.append({
                "group": group,
                "members": self.groups.members(group),
                "mode": self.groups.mode(group),
                "subscriptions": subscriptions,
                "topics": sorted(set(subscriptions) | set(committed.get(group, []))),
            })
        return out

    # --- simple consumer -------------------------------------------------------------------------

    async def receive(self, group: str, topic: str, tags: str, max_count: int,
                      invisible_ms: int, wait_ms: int) -> list[Received]:
        validate_group_name(group)
        cfg = self.pulls.readable_topic(topic, 0)
        wait_ms = max(0, min(wait_ms, self.long_poll_max_ms))
        if self.pulls.closing:
            wait_ms = 0
        return await self.simple.receive(group, topic, list(range(cfg.queues)), tags or "*",
                                         max_count, invisible_ms, wait_ms)

    async def ack(self, group: str, receipt_handles: list[str]) -> int:
        validate_group_name(group)
        return await self.simple.ack(group, receipt_handles)

    async def change_invisibility(self, group: str, receipt_handle: str,
                                  invisible_ms: int) -> str:
        validate_group_name(group)
        return await self.simple.change_invisibility(group, receipt_handle, invisible_ms)
