"""Which queue a message goes to: round robin, by sharding key, or an explicit queue id.

The candidates are a route's writable (broker, queue) pairs sorted by (broker name, queue id),
so round robin alternates over every queue of every broker. A sharding key maps to
``crc32(key) % len(queues)`` — a hash that is the same in every process and every Python
version (unlike ``hash()``), so all producers put one key on one queue while the route is stable.

With a ``BrokerHealth``, round robin skips the queues of groups that are backing off and of the
groups in ``avoid`` (those that already failed this send); when that leaves nothing, every queue
is a candidate again. A sharding key keeps its queue whatever the health (ordering), unless
``reshard`` is set: then a key whose group is unusable is hashed over the usable queues instead.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Collection, Sequence

from tidemq._exceptions import server_error
from tidemq._fault import BrokerHealth
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
        health: BrokerHealth | None = None,
        avoid: Collection[str] = (),
        reshard: bool = False,
    ) -> MessageQueue:
        """A queue for one message; ``broker`` (an address) restricts the candidates to it.

        An explicit ``queue_id`` is that queue on the first broker (by name) that has it; a
        queue id the route does not know yet goes to the first broker, which decides.
        ``health`` and ``avoid`` (broker names) steer round robin away from failing groups
        (see the module docstring); the chosen group, if failing, gets this send as its probe.
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
        steer = bool(avoid) or bool(health)
        if sharding_key is not None:
            chosen = queues[shard_index(sharding_key, len(queues))]
            if reshard and steer and not _fine(chosen, health, avoid):
                usable = _usable(queues, health, avoid)
                if usable:
                    chosen = usable[shard_index(sharding_key, len(usable))]
        else:
            index = self._advance(route.topic)
            if steer:  # nothing usable: groups not yet tried by this send, else any
                queues = (_usable(queues, health, avoid)
                          or [q for q in queues if q.broker_name not in avoid] or queues)
            chosen = queues[index % len(queues)]
        if health:
            health.claim(chosen.broker_name)
        return chosen

    def round_robin(self, route: TopicRoute) -> MessageQueue:
        """``select(route)`` for a message without key or queue id while no group is failing
        (the send hot path: nothing to steer around, no keyword arguments to bind)."""
        queues = route.write_queues()
        if not queues:
            raise server_error(ErrorCode.TOPIC_NOT_FOUND,
                               f"no broker accepts writes to topic {route.topic!r}")
        return queues[self._advance(route.topic) % len(queues)]

    def round_robin_over(self, topic: str, queues: Sequence[MessageQueue]) -> MessageQueue:
        """``select(route, broker=...)`` with the broker's ``queues`` (not empty) listed by
        the caller once for many messages (``send_batch``)."""
        return queues[self._advance(topic) % len(queues)]

    def _advance(self, topic: str) -> int:
        current = self._next.get(topic)
        if current is None:
            current = random.randrange(1 << 16)  # producers do not all start on queue 0
        self._next[topic] = current + 1
        return current


def _fine(queue: MessageQueue, health: BrokerHealth | None, avoid: Collection[str]) -> bool:
    name = queue.broker_name
    return name not in avoid and (health is None or health.usable(name))


def _usable(queues: Sequence[MessageQueue], health: BrokerHealth | None,
            avoid: Collection[str]) -> list[MessageQueue]:
    """The queues of groups neither avoided nor backing off."""
    ok = {name for name in {q.broker_name for q in queues} if name not in avoid
          and (health is None or health.usable(name))}
    return [q for q in queues if q.broker_name in ok]
