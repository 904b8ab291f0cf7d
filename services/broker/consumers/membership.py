"""Who is alive: consumer group members and producer group members, kept by heartbeats.

Consumers heartbeat every 10 s with their subscriptions; a member silent for ``expiry_s`` (30 s)
is dropped and the rest rebalance on their next heartbeat (the member list is the answer). A
closing consumer leaves at once. Producers heartbeat too, so that transaction checks go only to
live producers.

Membership lives in memory: after a broker restart every live client is back within one
heartbeat interval. Reads (``members``, ``live``) already hide members past their expiry; the
``GroupExpiryLoop`` removes them and logs who left.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from tidemq.protocol import ErrorCode, ProtocolError
from tidemq.protocol.tags import TagExpression

from tidemq_server.common.constants import CONSUMER_EXPIRY_S, PRODUCER_EXPIRY_S
from tidemq_server.common.loop import BackgroundLoop

log = logging.getLogger(__name__)

EXPIRY_INTERVAL_S = 5.0  # how often GroupExpiryLoop drops silent members


class ConsumeMode(StrEnum):
    CLUSTERING = "clustering"  # the group shares the queues: each message to one member
    BROADCASTING = "broadcasting"  # every member gets every message


@dataclass(slots=True)
class _Member:
    last_seen: float  # clock() of the last heartbeat
    subscriptions: dict[str, str] = field(default_factory=dict)  # topic → tag expression
    mode: str = ConsumeMode.CLUSTERING.value


class _Liveness:
    """Members per group with the time each was last heard from."""

    kind = "group"

    def __init__(self, expiry_s: float, clock: Callable[[], float]) -> None:
        self.expiry_s = expiry_s
        self.clock = clock
        self._groups: dict[str, dict[str, _Member]] = {}

    def _touch(self, group: str, client_id: str) -> _Member:
        if not client_id:
            raise ProtocolError(ErrorCode.BAD_REQUEST, "client_id must be a non-empty string")
        members = self._groups.setdefault(group, {})
        member = members.get(client_id)
        now = self.clock()
        if member is None:
            member = members[client_id] = _Member(last_seen=now)
            log.info("%s %s: %s joined (%d member(s))", self.kind, group, client_id, len(members))
        else:
            member.last_seen = now
        return member

    def _live(self, group: str) -> dict[str, _Member]:
        members = self._groups.get(group)
        if not members:
            return {}
        oldest = self.clock() - self.expiry_s
        return {cid: m for cid, m in members.items() if m.last_seen >= oldest}

    def leave(self, group: str, client_id: str) -> bool:
        """Drop a member now; False when it was not a member."""
        members = self._groups.get(group)
        if not members or members.pop(client_id, None) is None:
            return False
        if not members:
            del self._groups[group]
        log.info("%s %s: %s left (%d member(s))", self.kind, group, client_id, len(members))
        return True

    def count(self, group: str) -> int:
        """Live members of a group."""
        return len(self._live(group))

    def groups(self) -> list[str]:
        """Groups with at least one live member, sorted."""
        return sorted(g for g in self._groups if self._live(g))

    def expire(self) -> list[tuple[str, str]]:
        """Drop members silent longer than ``expiry_s``; returns the (group, client id) dropped."""
        oldest = self.clock() - self.expiry_s
        dropped: list[tuple[str, str]] = []
        for group in list(self._groups):
            members = self._groups[group]
            for client_id in [c for c, m in members.items() if m.last_seen < oldest]:
                del members[client_id]
                dropped.append((group, client_id))
            if not members:
                del self._groups[group]
        return dropped


class GroupRegistry(_Liveness):
    """Consumer groups: members, their subscriptions and consume mode."""

    kind = "consumer group"

    def __init__(self, expiry_s: float = CONSUMER_EXPIRY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(expiry_s, clock)

    def heartbeat(self, group: str, client_id: str, subscriptions: dict[str, str],
                  mode: str = ConsumeMode.CLUSTERING.value) -> list[str]:
        """Record a member's heartbeat; returns the live members, sorted (the rebalance view)."""
        try:
            mode = ConsumeMode(mode).value
        except ValueError:
            raise ProtocolError(ErrorCode.BAD_REQUEST,
                                f"mode {mode!r} must be 'clustering' or 'broadcasting'") from None
        member = self._touch(group, client_id)
        member.subscriptions = dict(subscriptions)
        member.mode = mode
        return sorted(self._live(group))

    def members(self, group: str) -> list[str]:
        """Live member ids, sorted ([] for an unknown group)."""
        return sorted(self._live(group))

    def subscriptions(self, group: str) -> dict[str, str]:
        """Topic → tag expression over all live members (tags of differing members united)."""
        merged: dict[str, TagExpression] = {}
        for member in self._live(group).values():
            for topic, expression in member.subscriptions.items():
                tags = TagExpression.parse(expression)
                current = merged.get(topic)
                merged[topic] = tags if current is None else current.union(tags)
        return {t: str(tags) for t, tags in sorted(merged.items())}

    def mode(self, group: str) -> str | None:
        """Consume mode of the group (its most recent heartbeat), None when it has no member."""
        live = self._live(group)
        if not live:
            return None
        return max(live.values(), key=lambda m: m.last_seen).mode


class ProducerRegistry(_Liveness):
    """Producer groups: which producers are alive to answer transaction checks."""

    kind = "producer group"

    def __init__(self, expiry_s: float = PRODUCER_EXPIRY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(expiry_s, clock)

    def heartbeat(self, group: str, client_id: str) -> list[str]:
        """Record a producer's heartbeat; returns the live producers of the group, sorted."""
        self._touch(group, client_id)
        return sorted(self._live(group))

    def live(self, group: str) -> list[str]:
        """Producers heard from within ``expiry_s``, sorted."""
        return sorted(self._live(group))

    def is_live(self, group: str, client_id: str) -> bool:
        return client_id in self._live(group)


class GroupExpiryLoop(BackgroundLoop):
    """Every few seconds, drops members silent past their expiry and logs who left."""

    name = "group-expiry"

    def __init__(self, registry: _Liveness, interval_s: float = EXPIRY_INTERVAL_S) -> None:
        super().__init__(interval_s)
        self.registry = registry

    async def run_once(self) -> None:
        for group, client_id in self.registry.expire():
            log.info("%s %s: %s silent for more than %.0fs, dropped (%d member(s) left)",
                     self.registry.kind, group, client_id, self.registry.expiry_s,
                     self.registry.count(group))
