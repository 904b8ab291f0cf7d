"""The nameserver's whole state: live broker registrations and the topic routes they imply.

Pure and synchronous (no I/O, no asyncio), with injectable clocks so tests can move time.
Liveness is measured on a monotonic clock, so a step of the wall clock (NTP, a resumed VM) does
not expire every broker at once; the wall clock only stamps ``last_heartbeat_ms`` for display.

- A broker group is a ``broker_name``; its members differ by ``broker_id`` (0 while primary).
  A registration is keyed by ``(broker_name, broker_id)`` (docs/architecture.md#replication).
- A heartbeat *replaces* that member's registration, topic set included: a topic the broker no
  longer reports disappears from its routes at once.
- A broker whose last heartbeat is ``expiry_ms`` or more old (monotonic) is dead: reads never
  show it, and ``expire()`` removes it for good (the service calls it periodically). A clean
  stop (``unregister``) removes it at once.
- A route has one entry per group that has a live primary serving the topic: the primary's
  address, queue count and permission, plus the addresses of the group's live replicas that
  serve the topic too (readable copies). A group whose primary is gone while a successor is
  elected is routed read-only (perm "r") at its most caught-up replica: consumers keep reading
  (RocketMQ's slave read) and producers wait for the new primary.
- A primary registering under a newer epoch drops every older primary claim of its group at
  once (the deposed or dead primary), so routes switch without waiting for its expiry; and a
  primary claim under an older epoch than a live member of its group knows (a primary cut off
  from etcd but not from us, heartbeating before it learns it was deposed) is refused: it
  removes that member's registration instead of listing a second primary.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

Clock = Callable[[], int]  # milliseconds: since the epoch (wall) or an arbitrary start (monotonic)

PRIMARY = "primary"
REPLICA = "replica"

BrokerKey = tuple[str, int]  # (broker_name, broker_id)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """How one broker serves one topic."""

    queues: int  # number of queues of the topic on this broker
    perm: str  # "r", "w" or "rw"

    def to_wire(self) -> dict[str, Any]:
        return {"queues": self.queues, "perm": self.perm}


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    """What one broker (one member of a group) last told us about itself."""

    cluster: str
    broker_name: str
    address: str  # base URL clients use to reach the broker, e.g. http://127.0.0.1:10911
    topics: Mapping[str, TopicInfo] = field(default_factory=dict)
    last_heartbeat_ms: int = 0  # wall clock of the last heartbeat (ms)
    broker_id: int = 0  # member of the group (0 while primary)
    role: str = PRIMARY  # "primary" or "replica"
    epoch: int = 0  # the group's leadership term (0 without replication)
    grpc_address: str | None = None  # host:port of its gRPC door, None when it has none
    max_offset: int = 0  # commit log max physical offset at the heartbeat (bytes)
    # base URL the deployment's own services use, None when it is ``address`` (compose: the
    # container's name, while ``address`` is the published port clients on the host use)
    internal_address: str | None = None
    seen_ms: int = 0  # monotonic clock of the last heartbeat (ms): liveness, never shown

    @property
    def key(self) -> BrokerKey:
        return (self.broker_name, self.broker_id)

    def to_wire(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "broker_name": self.broker_name,
            "broker_id": self.broker_id,
            "role": self.role,
            "epoch": self.epoch,
            "address": self.address,
            "internal_address": self.internal_address,
            "grpc_address": self.grpc_address,
            "max_offset": self.max_offset,
            "last_heartbeat_ms": self.last_heartbeat_ms,
            "topics": {name: info.to_wire() for name, info in sorted(self.topics.items())},
        }


@dataclass(frozen=True, slots=True)
class QueueRoute:
    """One group's share of a topic, as answered by ``GET /v1/routes/{topic}``."""

    broker_name: str
    address: str
    queues: int
    perm: str
    replicas: tuple[str, ...] = ()  # base URLs of the group's readable copies

    def to_wire(self) -> dict[str, Any]:
        return {"broker_name": self.broker_name, "address": self.address,
                "queues": self.queues, "perm": self.perm, "replicas": list(self.replicas)}


class BrokerRegistry:
    """Broker registrations keyed by (broker name, broker id), with expiry of silent brokers."""

    def __init__(self, expiry_ms: int, clock: Clock = wall_clock_ms,
                 monotonic: Clock = monotonic_ms) -> None:
        if expiry_ms <= 0:
            raise ValueError(f"expiry_ms must be positive, got {expiry_ms}")
        self.expiry_ms = expiry_ms
        self._clock = clock  # stamps last_heartbeat_ms
        self._monotonic = monotonic  # decides liveness
        self._brokers: dict[BrokerKey, BrokerRegistration] = {}

    # --- writes -------------------------------------------------------------------------------

    def heartbeat(self, cluster: str, broker_name: str, address: str,
                  topics: Mapping[str, TopicInfo], *, broker_id: int = 0, role: str = PRIMARY,
                  epoch: int = 0, grpc_address: str | None = None,
                  max_offset: int = 0, internal_address: str | None = None,
                  ) -> BrokerRegistration | None:
        """Record a heartbeat: the member's registration (and topic set) becomes exactly this.
        None: a stale primary claim, refused (and the member's registration removed)."""
        now = self._monotonic()
        key = (broker_name, broker_id)
        previous = self._brokers.get(key)
        if role == PRIMARY and epoch > 0 and (newer := self._newer_epoch(key, epoch, now)):
            self._brokers.pop(key, None)
            log.warning("broker %s/%d (%s) claims primary under epoch %d, but its group is at "
                        "epoch %d: not listed until it follows the new primary", broker_name,
                        broker_id, address, epoch, newer)
            return None
        registration = BrokerRegistration(
            cluster=cluster, broker_name=broker_name, address=address, topics=dict(topics),
            last_heartbeat_ms=self._clock(), broker_id=broker_id, role=role, epoch=epoch,
            grpc_address=grpc_address, max_offset=max_offset,
            internal_address=internal_address, seen_ms=now)
        self._brokers[key] = registration
        who = f"{broker_name}/{broker_id}"
        if role == PRIMARY and epoch > 0:
            self._drop_older_primaries(registration)
        if previous is None or not self._alive(previous, now):
            log.info("broker %s registered: cluster %s, %s at %s, %d topic(s)",
                     who, cluster, role, address, len(topics))
        elif previous.address != address or previous.cluster != cluster:
            log.warning("broker %s moved: %s (cluster %s) -> %s (cluster %s)", who,
                        previous.address, previous.cluster, address, cluster)
        elif previous.role != role or previous.epoch != epoch:
            log.info("broker %s is now %s (epoch %d -> %d)", who, role, previous.epoch, epoch)
        else:
            added = sorted(set(topics) - set(previous.topics))
            removed = sorted(set(previous.topics) - set(topics))
            if added or removed:
                log.info("broker %s topics changed: +%s -%s", who, added, removed)
        return registration

    def _newer_epoch(self, key: BrokerKey, epoch: int, now: int) -> int:
        """The newest epoch a live member of ``key``'s group (other than ``key``) reports, when
        newer than ``epoch``; else 0."""
        newest = max((b.epoch for b in self._brokers.values()
                      if b.broker_name == key[0] and b.key != key and self._alive(b, now)),
                     default=0)
        return newest if newest > epoch else 0

    def _drop_older_primaries(self, primary: BrokerRegistration) -> None:
        stale = [b for b in self._brokers.values()
                 if b.broker_name == primary.broker_name and b.key != primary.key
                 and b.role == PRIMARY and b.epoch < primary.epoch]
        for old in stale:
            del self._brokers[old.key]
            log.warning("broker %s/%d (%s) no longer leads: %s/%d is primary under epoch %d "
                        "(was %d)", old.broker_name, old.broker_id, old.address,
                        primary.broker_name, primary.broker_id, primary.epoch, old.epoch)

    def unregister(self, broker_name: str, address: str | None = None,
                   broker_id: int | None = None) -> bool:
        """Forget a broker now (a clean shutdown): the member ``broker_id``, or every member of
        the group when it is None. With ``address``, only members still at that address, so a
        late goodbye from an old process cannot remove its restarted successor."""
        gone = [b for b in self._brokers.values()
                if b.broker_name == broker_name
                and (broker_id is None or b.broker_id == broker_id)
                and (address is None or b.address == address)]
        for broker in gone:
            del self._brokers[broker.key]
            log.info("broker %s/%d (%s) unregistered", broker.broker_name, broker.broker_id,
                     broker.address)
        return bool(gone)

    def expire(self) -> list[BrokerRegistration]:
        """Remove every broker silent for ``expiry_ms`` or longer; return the removed ones."""
        now = self._monotonic()
        dead = [b for b in self._brokers.values() if not self._alive(b, now)]
        for broker in dead:
            del self._brokers[broker.key]
            log.warning("broker %s/%d (%s) expired: no heartbeat for %.1f s", broker.broker_name,
                        broker.broker_id, broker.address,
                        (now - broker.seen_ms) / 1000)
        return dead

    # --- reads (never show a broker that is already past its expiry) -------------------------

    def brokers(self) -> list[BrokerRegistration]:
        """Live brokers, sorted by cluster, name, then id."""
        now = self._monotonic()
        live = [b for b in self._brokers.values() if self._alive(b, now)]
        return sorted(live, key=lambda b: (b.cluster, b.broker_name, b.broker_id))

    def routes(self, topic: str) -> list[QueueRoute]:
        """One entry per group whose live primary serves ``topic``, sorted by broker name;
        empty when none does."""
        groups: dict[str, list[BrokerRegistration]] = {}
        for broker in self.brokers():
            if topic in broker.topics:
                groups.setdefault(broker.broker_name, []).append(broker)
        routes = []
        for name in sorted(groups):
            members = groups[name]
            primaries = [b for b in members if b.role == PRIMARY]
            replicas = tuple(b.address for b in members if b.role == REPLICA)
            if not primaries:
                # electing a new primary: read-only at the most caught-up replica
                best = max((b for b in members if b.role == REPLICA),
                           key=lambda b: (b.max_offset, -b.broker_id))
                info = best.topics[topic]
                if "r" in info.perm:
                    routes.append(QueueRoute(broker_name=name, address=best.address,
                                             queues=info.queues, perm="r", replicas=replicas))
                continue
            # two primaries only during a failover: the newer term wins
            primary = max(primaries, key=lambda b: (b.epoch, -b.broker_id))
            info = primary.topics[topic]
            routes.append(QueueRoute(broker_name=name, address=primary.address,
                                     queues=info.queues, perm=info.perm, replicas=replicas))
        return routes

    def topics(self) -> set[str]:
        """Names of every topic some live broker serves."""
        return {name for b in self.brokers() for name in b.topics}

    def __len__(self) -> int:
        return len(self.brokers())

    def _alive(self, broker: BrokerRegistration, now: int) -> bool:
        return now - broker.seen_ms < self.expiry_ms
