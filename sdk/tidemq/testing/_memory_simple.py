"""The simple consumer of the in-memory broker (docs/api.md, "Simple consumer"): receive with
an invisibility time, ack, change of invisibility; what is not acked in time (on the broker's
clock) is received again with a new handle, ``reconsume_times`` counting the deliveries.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from tidemq.protocol import ErrorCode, ProtocolError
from tidemq.protocol.tags import TagExpression
from tidemq.testing._memory_store import MAX_PULL, MemoryStore, Stored


@dataclass(slots=True)
class Receipt:
    """A message received by a simple-consumer group: invisible until ``visible_ms``."""

    copy: Stored
    handle: str
    visible_ms: int
    deliveries: int = 1


@dataclass(slots=True)
class SimpleGroup:
    cursors: dict[tuple[str, int], int] = field(default_factory=dict)  # next offset to hand out
    receipts: dict[tuple[str, int, int], Receipt] = field(default_factory=dict)  # not acked


class MemorySimple:
    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.groups: dict[str, SimpleGroup] = {}
        self._handles = itertools.count(1)

    def receive(self, group: str, topic_name: str, tags: str, limit: int,
                invisible_ms: int) -> list[dict[str, Any]]:
        """Messages whose invisibility ran out first (again, with a new handle), then new
        ones; each invisible for ``invisible_ms`` from now."""
        topic = self.store.topic(topic_name)
        state = self.groups.setdefault(group, SimpleGroup())
        now = self.store.clock.now_ms
        wanted = TagExpression.parse(tags)
        out: list[dict[str, Any]] = []
        limit = max(1, min(limit, MAX_PULL))
        for receipt in sorted(state.receipts.values(), key=lambda r: r.visible_ms):
            if len(out) >= limit or receipt.visible_ms > now or receipt.copy.topic != topic.name:
                continue
            receipt.deliveries += 1
            out.append(self._hand_out(group, receipt, invisible_ms, now))
        for queue_id, queue in enumerate(topic.queues):
            cursor = state.cursors.get((topic.name, queue_id), 0)
            while cursor < len(queue) and len(out) < limit:
                copy = queue[cursor]
                cursor += 1
                if wanted.matches(copy.tag):
                    receipt = Receipt(copy, "", 0)
                    state.receipts[(copy.topic, copy.queue_id, copy.queue_offset)] = receipt
                    out.append(self._hand_out(group, receipt, invisible_ms, now))
            state.cursors[(topic.name, queue_id)] = cursor
        return out

    def _hand_out(self, group: str, receipt: Receipt, invisible_ms: int, now: int
                  ) -> dict[str, Any]:
        receipt.handle = f"{group}:{next(self._handles)}"
        receipt.visible_ms = now + invisible_ms
        return receipt.copy.wire(receipt_handle=receipt.handle,
                                 reconsume_times=receipt.copy.reconsume_times
                                 + receipt.deliveries - 1)

    def _receipt(self, group: str, handle: object) -> Receipt | None:
        if not isinstance(handle, str) or handle.partition(":")[0] != group \
                or not handle.partition(":")[2].isdigit():
            raise ProtocolError(ErrorCode.INVALID_RECEIPT_HANDLE,
                                f"{handle!r} is not a receipt handle of group {group!r}")
        state = self.groups.get(group)
        for receipt in state.receipts.values() if state else ():
            if receipt.handle == handle:
                return receipt
        return None

    def ack(self, group: str, handles: list[Any]) -> int:
        receipts = [self._receipt(group, h) for h in handles]
        acked = 0
        for receipt in receipts:
            if receipt is not None:
                c = receipt.copy
                if self.groups[group].receipts.pop((c.topic, c.queue_id, c.queue_offset), None):
                    acked += 1
        return acked

    def change_invisibility(self, group: str, handle: Any, invisible_ms: int) -> str:
        receipt = self._receipt(group, handle)
        if receipt is None:
            raise ProtocolError(ErrorCode.INVALID_RECEIPT_HANDLE,
                                f"receipt handle {handle!r} is no longer current")
        receipt.handle = f"{group}:{next(self._handles)}"
        receipt.visible_ms = self.store.clock.now_ms + invisible_ms
        return receipt.handle
