"""The nameserver's whole state: live broker registrations and the topic routes they imply.

Pure and synchronous (no I/O, no asyncio), with an injectable clock so tests can move time.

- A broker is identified by its ``broker_name`` (one broker process per name, DESIGN §8b).
- A heartbeat *replaces* that broker's registration, topic set included: a topic the broker no
  longer reports disappears from its routes at once.
- A broker whose last heartbeat is ``expiry_ms`` or more old is dead: reads never show it, and
  ``expire()`` removes it for good (the service calls it periodically).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

Clock = Callable[[], int]  # wall-clock milliseconds since the epoch


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """How one broker serves one topic."""

    queues: int  # number of queues of the topic on this broker
    perm: str  # "r", "w" or "rw"

    def to_wire(self) -> dict[str, Any]:
        return {"queues": self.queues, "perm": self.perm}


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    """What one broker last told us about itself."""

    cluster: str
    broker_name: str
    address: str  # base URL clients use to reach the broker, e.g. http://127.0.0.1:10911
    topics: Mapping[str, TopicInfo] = field(default_factory=dict)
    last_heartbeat_ms: int = 0  # wall clock of the last heartbeat (ms)

    def to_wire(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "broker_name": self.broker_name,
            "address": self.address,
            "last_heartbeat_ms": self.last_heartbeat_ms,
            "topics": {name: info.to_wire() for name, info in sorted(self.topics.items())},
        }


@dataclass(frozen=True, slots=True)
class QueueRoute:
    """One broker's share of a topic, as answered by ``GET /v1/routes/{topic}``."""

    broker_name: str
    address: str
    queues: int
    perm: str

    def to_wire(self) -> dict[str, Any]:
        return {"broker_name": self.broker_name, "address": self.address,
                "queues": self.queues, "perm": self.perm}


class BrokerRegistry:
    """Broker registrations keyed by broker name, with expiry of silent brokers."""

    def __init__(self, expiry_ms: int, clock: Clock = wall_clock_ms) -> None:
        if expiry_ms <= 0:
            raise ValueError(f"expiry_ms must be positive, got {expiry_ms}")
        self.expiry_ms = expiry_ms
        self._clock = clock
        self._brokers: dict[str, BrokerRegistration] = {}

    # --- writes -------------------------------------------------------------------------------

    def heartbeat(self, cluster: str, broker_name: str, address: str,
                  topics: Mapping[str, TopicInfo]) -> BrokerRegistration:
        """Record a heartbeat: the broker's registration (and topic set) becomes exactly this."""
        now = self._clock()
        previous = self._brokers.get(broker_name)
        registration = BrokerRegistration(cluster=cluster, broker_name=broker_name,
                                          address=address, topics=dict(topics),
                                          last_heartbeat_ms=now)
        self._brokers[broker_name] = registration
        if previous is None or not self._alive(previous, now):
            log.info("broker %s registered: cluster %s, address %s, %d topic(s)",
                     broker_name, cluster, address, len(topics))
        elif previous.address != address or previous.cluster != cluster:
            log.warning("broker %s moved: %s (cluster %s) -> %s (cluster %s)", broker_name,
                        previous.address, previous.cluster, address, cluster)
        else:
            added = sorted(set(topics) - set(previous.topics))
            removed = sorted(set(previous.topics) - set(topics))
            if added or removed:
                log.info("broker %s topics changed: +%s -%s", broker_name, added, removed)
        return registration

    def unregister(self, broker_name: str, address: str | None = None) -> bool:
        """Forget a broker now (a clean shutdown). With ``address``, only if it still matches,
        so a late goodbye from an old process cannot remove its restarted successor."""
        current = self._brokers.get(broker_name)
        if current is None or (address is not None and current.address != address):
            return False
        del self._brokers[broker_name]
        log.info("broker %s (%s) unregistered", broker_name, current.address)
        return True

    def expire(self) -> list[BrokerRegistration]:
        """Remove every broker silent for ``expiry_ms`` or longer; return the removed ones."""
        now = self._clock()
        dead = [b for b in self._brokers.values() if not self._alive(b, now)]
        for broker in dead:
            del self._brokers[broker.broker_name]
            log.warning("broker %s (%s) expired: no heartbeat for %.1f s", broker.broker_name,
                        broker.address, (now - broker.last_heartbeat_ms) / 1000)
        return dead

    # --- reads (never show a broker that is already past its expiry) -------------------------

    def brokers(self) -> list[BrokerRegistration]:
        """Live brokers, sorted by cluster then name."""
        now = self._clock()
        live = [b for b in self._brokers.values() if self._alive(b, now)]
        return sorted(live, key=lambda b: (b.cluster, b.broker_name))

    def routes(self, topic: str) -> list[QueueRoute]:
        """Every live broker serving ``topic``, sorted by broker name; empty when none does."""
        return [
            QueueRoute(broker_name=b.broker_name, address=b.address,
                       queues=b.topics[topic].queues, perm=b.topics[topic].perm)
            for b in sorted(self.brokers(), key=lambda b: b.broker_name)
            if topic in b.topics
        ]

    def topics(self) -> set[str]:
        """Names of every topic some live broker serves."""
        return {name for b in self.brokers() for name in b.topics}

    def __len__(self) -> int:
        return len(self.brokers())

    def _alive(self, broker: BrokerRegistration, now: int) -> bool:
        return now - broker.last_heartbeat_ms < self.expiry_ms
