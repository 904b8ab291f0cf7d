"""Which queue a message goes to: round robin, by sharding key, or an explicit queue id.

The candidates are a route's writable (broker, queue) pairs sorted by (broker name, queue id),
so round robin alternates over every queue of every broker. A sharding key maps to
``crc32(key) % len(queues)`` — a hash that is the same in every process and every Python
version (unlike ``hash()``), so all producers put one key on one queue while the route is stable.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence

from tidemq._exceptions import server_error
from tidemq._routes import MessageQueue, TopicRoute
from tidemq.protocol import ErrorCode


def shard_index(sharding_key: str, queues: int) -> int:
    """The index of the queue for ``sharding_key`` among ``queues`` queues."""
    return zlib.crc32(sharding_key.encode("utf-8")) % queues


class QueueSelector:
    """Per-topic round robin plus key and explicit selection."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def select(
        self,
        route: TopicRoute,
        *,
        sharding_key: str | None = None,
        queue_id: int | None = None,
        broker: str | None = None,
    ) -> MessageQueue:
        """A queue for one message; ``broker`` (an address) restricts the candidates to it.

        An explicit ``queue_id`` is that queue on the first broker (by name) that has it; a
        queue id the route does not know yet goes to the first broker, which decides.
        """
        queues: Sequence[MessageQueue] = route.write_queues()
        if broker is not None:
            queues = [q for q in queues if q.address == broker]
        if not queues:
            raise server_error(ErrorCode.TOPIC_NOT_FOUND,
                               f"no broker accepts writes to topic {route.topic!r}")
        if queue_id is not None:
            for q in queues:
                if q.queue_id == queue_id:
                    return q
            first = queues[0]
            return MessageQueue(first.broker_name, first.topic, queue_id, first.address)
        if sharding_key is not None:
            return queues[shard_index(sharding_key, len(queues))]
        return queues[self._advance(route.topic) % len(queues)]

    def next_broker(self, route: TopicRoute) -> str:
        """The broker of the next round-robin queue (for a batch that must go to one broker)."""
        return self.select(route).address

    def _advance(self, topic: str) -> int:
        current = self._next.get(topic)
        if current is None:
            current = random.randrange(1 << 16)  # producers do not all start on queue 0
        self._next[topic] = current + 1
        return current
