"""When a starting nameserver may answer 404 for an unknown topic.

Its registry is memory only, so right after a start a topic it does not know may just belong
to a broker group that has not heartbeated yet: 503 UNAVAILABLE (retry) is the honest answer
then, not 404 TOPIC_NOT_FOUND. The warm-up ends at ``warmup_s`` at the latest, and as soon as
it can know: once every broker group it knows of has a primary registered since this start.

It knows of the groups named by its ``expect_brokers`` setting (``tidemq up`` passes the
groups it starts) and of those in the cluster view of its peers (``GET /v1/cluster`` of every
other nameserver, asked at start and again each second until one answers; a peer that is
warming up itself is not asked to vouch). Knowing of no group (no setting, no peer answered
yet) it waits the whole ``warmup_s``, as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

import httpx

from tidemq_server.common.auth.client import service_auth
from tidemq_server.common.constants import CLUSTER_PATH, DISCOVERY_TIMEOUT_S
from tidemq_server.common.tls import client_context

log = logging.getLogger(__name__)

PEER_RETRY_S = 1.0  # a starting nameserver asks unanswered peers again this often (s)


class WarmUp:
    """``warming(primaries)``: True while an unknown topic must answer 503."""

    def __init__(self, warmup_s: float, expected: Iterable[str],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.warmup_s = warmup_s
        self.expected: set[str] = {g for g in expected if g}
        self.peer_answered = False  # a peer not warming up itself gave its cluster view
        self._clock = clock
        self.started = clock()
        self.over = warmup_s <= 0
        self.ended_by = "setting" if self.over else ""  # "time", or "all registered"

    def restart(self) -> None:
        """Count from now (when serving starts)."""
        self.started = self._clock()

    def age_s(self) -> float:
        return self._clock() - self.started

    def knows(self) -> bool:
        return bool(self.expected) or self.peer_answered

    def warming(self, primaries: set[str]) -> bool:
        """Still warming up, given the broker groups with a primary registered since start."""
        if self.over:
            return False
        if self.age_s() >= self.warmup_s:
            self._end("time")
        elif self.knows() and self.expected <= primaries:
            self._end("all registered")
        return not self.over

    def learn(self, groups: Iterable[str]) -> None:
        """A peer's view: these groups have a live primary in the cluster."""
        self.expected |= set(groups)
        self.peer_answered = True

    def _end(self, why: str) -> None:
        self.over, self.ended_by = True, why
        log.info("warm-up over after %.1f s (%s): an unknown topic is 404 now", self.age_s(),
                 "every known broker group registered" if why == "all registered"
                 else "its full length")


async def ask_peers(warm: WarmUp, peers: list[str]) -> None:
    """Learn the cluster view of the first peer that answers and is not warming up itself,
    until the warm-up ends (this nameserver, listed among its peers, answers warming up)."""
    if not peers or warm.over:
        return
    async with httpx.AsyncClient(timeout=DISCOVERY_TIMEOUT_S, verify=client_context(),
                                 auth=service_auth()) as http:
        while not warm.over and warm.age_s() < warm.warmup_s:
            for peer in peers:
                try:
                    resp = await http.get(peer + CLUSTER_PATH)
                    view = resp.json() if resp.is_success else None
                except (httpx.HTTPError, ValueError):
                    continue
                if not isinstance(view, dict) or view.get("warming_up"):
                    continue
                groups = {str(b.get("broker_name")) for b in view.get("brokers", [])
                          if isinstance(b, dict) and b.get("role", "primary") == "primary"}
                warm.learn(groups)
                log.info("cluster view from %s: broker groups %s", peer,
                         ", ".join(sorted(groups)) or "none")
                return
            await asyncio.sleep(PEER_RETRY_S)
