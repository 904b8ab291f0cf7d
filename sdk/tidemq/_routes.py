"""Which brokers serve a topic, and with how many queues.

With nameservers, ``GET /v1/routes/{topic}`` is asked of any nameserver that answers, starting
from the last one that did; the next is asked too once one has gone ``NAMESERVER_HEDGE_S``
without an answer, or at once when one fails (``_hedge.first_of``), so a nameserver cut off
costs a lookup that much, not its ``NAMESERVER_TIMEOUT_S``. With a single ``broker_url`` and
no nameserver, the broker itself is asked ``GET /v1/topics/{topic}``. Routes are cached,
refreshed in the background every ``refresh_interval_s`` and re-fetched on demand after an
error (``invalidate``). A refresh that fails keeps the last known route. A lookup is retried
like any call: until the retry policy's deadline (``max_attempts`` bounds the rounds when
given).

Senders ask for ``write_route``, which waits (within their deadline) while every group of the
topic is electing a primary, and ``known_route``, which waits while the nameservers answer
TOPIC_NOT_FOUND for a topic they routed before (its only broker restarting: a SIGTERMed broker
unregisters, and registers again once started); ``follow_primary`` moves a group to the primary
a NOT_PRIMARY answer named, when the route knows that address already (one of its replicas).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tidemq._constants import (
    NAMESERVER_HEDGE_S,
    NAMESERVER_TIMEOUT_S,
    PRIMARY_WAIT_POLL_S,
    ROUTE_REFRESH_INTERVAL_S,
)
from tidemq._exceptions import (
    TidemqError,
    TopicNotFoundError,
    TransportError,
    UnexpectedResponseError,
    server_error,
)
from tidemq._hedge import first_of
from tidemq._http import NO_RETRY, HttpClient, normalize_address, url
from tidemq._validate import endpoints
from tidemq.protocol import ErrorCode

log = logging.getLogger("tidemq.routes")


@dataclass(frozen=True, slots=True, order=True)
class MessageQueue:
    """One queue of a topic on one broker. Orders by (broker name, topic, queue id)."""

    broker_name: str
    topic: str
    queue_id: int
    address: str = field(compare=False)  # the broker's base URL

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker_name}#{self.queue_id}"


@dataclass(frozen=True, slots=True)
class BrokerRoute:
    """One broker's share of a topic."""

    broker_name: str
    address: str
    queues: int
    perm: str = "rw"
    replicas: tuple[str, ...] = ()  # base URLs of the group's replicas (readable copies)

    @property
    def readable(self) -> bool:
        return "r" in self.perm

    @property
    def writable(self) -> bool:
        return "w" in self.perm


@dataclass(frozen=True, slots=True)
class TopicRoute:
    """Every broker serving a topic; queue lists are computed once (send hot path)."""

    topic: str
    brokers: tuple[BrokerRoute, ...]
    _write: tuple[MessageQueue, ...] = field(init=False, repr=False, compare=False)
    _read: tuple[MessageQueue, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_write", self._queues(writable=True))
        object.__setattr__(self, "_read", self._queues(writable=False))

    def write_queues(self) -> tuple[MessageQueue, ...]:
        """Writable (broker, queue) pairs sorted by (broker name, queue id)."""
        return self._write

    def read_queues(self) -> tuple[MessageQueue, ...]:
        """Readable (broker, queue) pairs sorted by (broker name, queue id)."""
        return self._read

    def replicated(self, broker_name: str) -> bool:
        """Whether the group ``broker_name`` has replicas: a primary it loses is replaced."""
        return any(b.replicas for b in self.brokers if b.broker_name == broker_name)

    def electing(self) -> bool:
        """Some group serves the topic but none takes writes: a primary is being elected."""
        return not self._write and bool(self._read)

    def write_groups(self) -> frozenset[str]:
        """Names of the brokers (groups) that accept writes."""
        return frozenset(q.broker_name for q in self._write)

    def writable_queue(self, broker_name: str, queue_id: int) -> MessageQueue | None:
        """Queue ``queue_id`` of the group ``broker_name`` at the group's current writable
        address (a retry to the same group follows its new primary); None: not writable now."""
        for b in self.brokers:
            if b.broker_name == broker_name and b.writable:
                return MessageQueue(broker_name, self.topic, queue_id, b.address)
        return None

    def _queues(self, *, writable: bool) -> tuple[MessageQueue, ...]:
        return tuple(sorted(
            MessageQueue(b.broker_name, self.topic, q, b.address)
            for b in self.brokers
            if (b.writable if writable else b.readable)
            for q in range(b.queues)
        ))

    @property
    def addresses(self) -> list[str]:
        return sorted({b.address for b in self.brokers})


def parse_route(topic: str, payload: Any) -> TopicRoute:
    """A nameserver answer ``{topic, queues: [{broker_name, address, queues, perm}]}``."""
    try:
        brokers = tuple(
            BrokerRoute(str(q["broker_name"]), normalize_address(str(q["address"])),
                        int(q["queues"]), str(q.get("perm", "rw")),
                        tuple(normalize_address(str(r)) for r in q.get("replicas") or ()))
            for q in payload["queues"]
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise UnexpectedResponseError(f"malformed route for topic {topic!r}: {exc!r}") from exc
    return TopicRoute(topic, brokers)


@dataclass(slots=True)
class _Cached:
    route: TopicRoute
    fetched_at: float
    stale: bool = False  # an error was seen: ask again, but keep this if nobody answers


class RouteTable:
    """Topic → route, from nameservers or from one broker."""

    def __init__(
        self,
        http: HttpClient,
        *,
        nameservers: Sequence[str] | None = None,
        broker_url: str | None = None,
        refresh_interval_s: float = ROUTE_REFRESH_INTERVAL_S,
    ) -> None:
        where = endpoints(nameservers, broker_url, env={})  # the clients read the environment
        self._http = http
        self._nameservers = [normalize_address(n) for n in where.nameservers]
        self._broker = normalize_address(where.broker_url) if where.broker_url else None
        self.refresh_interval_s = refresh_interval_s
        self._cache: dict[str, _Cached] = {}
        self._loading: dict[str, asyncio.Task[TopicRoute]] = {}
        self._next_ns = 0
        self._task: asyncio.Task[None] | None = None
        self._known: set[str] = set()  # topics routed once: a TOPIC_NOT_FOUND may be passing

    @property
    def direct_broker(self) -> str | None:
        """The broker URL when running without nameservers."""
        return self._broker

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._refresh_loop(), name="tidemq-route-refresh")

    async def close(self) -> None:
        for task in list(self._loading.values()):
            task.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def cached(self, topic: str) -> TopicRoute | None:
        entry = self._cache.get(topic)
        return entry.route if entry else None

    def fresh(self, topic: str) -> TopicRoute | None:
        """The route ``get`` would answer at once (cached, not stale); None when it must be
        looked up. The send hot path asks this first: no coroutine per message."""
        entry = self._cache.get(topic)
        return entry.route if entry is not None and not entry.stale else None

    def invalidate(self, topic: str) -> None:
        """Mark a route stale (after a send or pull error): the next ``get`` asks again, and
        keeps the stale route only if no nameserver answers — an outage of the nameservers
        must not make a consumer drop queues it could still read."""
        entry = self._cache.get(topic)
        if entry is not None:
            entry.stale = True

    def follow_primary(self, topic: str, broker_name: str, address: str) -> bool:
        """A broker of group ``broker_name`` answered NOT_PRIMARY naming ``address`` as the
        primary: when the cached route knows that address as one of the group's brokers, make
        it the group's writable address now (the nameservers confirm at the next lookup). True
        when the route changed."""
        entry = self._cache.get(topic)
        if entry is None:
            return False
        address = normalize_address(address)
        brokers = list(entry.route.brokers)
        for i, b in enumerate(brokers):
            if b.broker_name != broker_name:
                continue
            if b.address == address and b.writable:
                return False
            if address != b.address and address not in b.replicas:
                return False  # not an address the nameservers gave us: ask them instead
            replicas = tuple(r for r in (*b.replicas, b.address) if r != address)
            perm = b.perm if b.writable else b.perm + "w"
            brokers[i] = BrokerRoute(b.broker_name, address, b.queues, perm, replicas)
            log.info("group %s of %r: following its new primary %s", broker_name, topic, address)
            self._cache[topic] = _Cached(TopicRoute(topic, tuple(brokers)), time.monotonic())
            return True
        return False

    async def known_route(self, topic: str, give_up_at: float) -> TopicRoute:
        """``get``, but a topic this table routed before that no nameserver knows now is asked
        for again every ``PRIMARY_WAIT_POLL_S`` until ``give_up_at`` (``time.monotonic()``): its
        broker is restarting. A topic never routed fails at once (a typo must not wait)."""
        while True:
            try:
                return await self.get(topic)
            except TopicNotFoundError:
                if topic not in self._known or time.monotonic() >= give_up_at:
                    raise
                log.info("no live broker serves %r for now: asking again", topic)
                await asyncio.sleep(PRIMARY_WAIT_POLL_S)

    async def write_route(self, topic: str, give_up_at: float) -> TopicRoute:
        """The topic's route (``known_route``); while every group serving it is electing a
        primary (the route is readable only), ask again every ``PRIMARY_WAIT_POLL_S`` until
        ``give_up_at`` (a ``time.monotonic()`` value: the caller's deadline)."""
        route = await self.known_route(topic, give_up_at)
        if not route.electing():
            return route
        log.info("no group serving %r has a primary: waiting up to %.1fs for one", topic,
                 max(0.0, give_up_at - time.monotonic()))
        while route.electing():
            if time.monotonic() >= give_up_at:
                raise server_error(ErrorCode.NOT_PRIMARY,
                                   f"no group serving topic {topic!r} has a primary")
            await asyncio.sleep(PRIMARY_WAIT_POLL_S)
            self.invalidate(topic)
            route = await self.known_route(topic, give_up_at)
        return route

    async def get(self, topic: str, *, patient: bool = True) -> TopicRoute:
        """The route of ``topic``, cached; concurrent misses share one lookup.

        ``patient=False`` asks each nameserver once instead of retrying with back-off: for a
        topic that may well not exist yet (a group's retry topic), whose absence must not hold
        up a consumer's start while a young nameserver still answers 503 for unknown topics.
        """
        entry = self._cache.get(topic)
        if entry is not None and not entry.stale:
            return entry.route
        task = self._loading.get(topic)
        if task is None:
            task = asyncio.create_task(self._load(topic, patient), name=f"tidemq-route-{topic}")
            self._loading[topic] = task
            task.add_done_callback(self._loaded)
        return await asyncio.shield(task)

    async def _load(self, topic: str, patient: bool = True) -> TopicRoute:
        try:
            route = await self._fetch(topic, patient)
        except TopicNotFoundError:
            self._cache.pop(topic, None)
            raise
        except TidemqError as exc:
            entry = self._cache.get(topic)
            if entry is None or not exc.retriable:
                raise
            log.warning("route lookup for %r failed, using the last known route: %s", topic, exc)
            entry.stale = False  # until the next error: do not stall every send on lookups
            return entry.route
        self._cache[topic] = _Cached(route, time.monotonic())
        self._known.add(topic)
        return route

    def _loaded(self, task: asyncio.Task[TopicRoute]) -> None:
        for topic, pending in list(self._loading.items()):
            if pending is task:
                del self._loading[topic]
        if not task.cancelled():
            task.exception()  # retrieved here so an unawaited failure is not logged as lost

    async def _fetch(self, topic: str, patient: bool = True) -> TopicRoute:
        if self._broker is not None:
            info = await self._http.call("GET", url(self._broker, "v1", "topics", topic))
            try:
                queues = int(info["queues"])
                perm = str(info.get("perm", "rw"))
            except (KeyError, TypeError, ValueError) as exc:
                raise UnexpectedResponseError(f"malformed topic {topic!r}: {exc!r}") from exc
            return TopicRoute(topic, (BrokerRoute("broker", self._broker, queues, perm),))
        return await self._ask_nameservers(topic, patient)

    async def _ask_nameservers(self, topic: str, patient: bool = True) -> TopicRoute:
        """Try nameservers in turn (each once per round), rounds with back-off until the retry
        policy gives up (its deadline, or ``max_attempts`` rounds when given).

        When none answers at all, one ``TransportError`` names every address tried and the
        last cause, with a hint; the failed attempts themselves are only logged at debug level.
        """
        policy = self._http.retry
        started = time.monotonic()
        last: TidemqError | None = None
        attempt = 0
        while True:
            attempt += 1
            route, not_found, failure = await self._round(topic, attempt)
            if route is not None:
                return route
            last = failure or last
            if not_found is not None:
                raise not_found
            pause = policy.backoff_s(attempt)
            if not patient or policy.exhausted(attempt, time.monotonic() - started, pause):
                break
            await asyncio.sleep(pause)
        assert last is not None
        if isinstance(last, TransportError):
            raise type(last)(unreachable_message(self._nameservers, topic, attempt, last,
                                                 time.monotonic() - started),
                             sent=last.sent) from last
        raise last

    async def _round(self, topic: str, attempt: int
                     ) -> tuple[TopicRoute | None, TopicNotFoundError | None, TidemqError | None]:
        """One round over the nameservers, hedged (``first_of``): the route, or None with the
        last TOPIC_NOT_FOUND and the last retriable failure; other errors are raised."""
        n = len(self._nameservers)
        order = [self._nameservers[(self._next_ns + k) % n] for k in range(n)]
        not_found: TopicNotFoundError | None = None
        last: TidemqError | None = None

        def failed(i: int, exc: BaseException) -> None:
            nonlocal not_found, last
            if isinstance(exc, TopicNotFoundError):
                not_found = exc  # another nameserver may know it already
            elif isinstance(exc, TidemqError) and exc.retriable:
                log.debug("nameserver %s: route lookup for %r failed (round %d): %s",
                          order[i], topic, attempt, exc)
                last = exc
            else:
                raise exc

        won = await first_of([functools.partial(self._lookup, ns, topic) for ns in order],
                             NAMESERVER_HEDGE_S, failed)
        if won is None:
            return None, not_found, last
        self._next_ns += won[0]  # start from the one that answered next time
        return won[1], None, None

    async def _lookup(self, nameserver: str, topic: str) -> TopicRoute:
        payload = await self._http.call(
            "GET", url(nameserver, "v1", "routes", topic), retry=NO_RETRY,
            timeout_s=min(self._http.timeout_s, NAMESERVER_TIMEOUT_S))
        return parse_route(topic, payload)

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_interval_s)
            for topic in list(self._cache):
                try:
                    route = await self._fetch(topic)
                except TopicNotFoundError:
                    log.warning("topic %r is no longer served by any broker", topic)
                    self._cache.pop(topic, None)
                except TidemqError as exc:
                    log.warning("route refresh for %r failed, keeping the last one: %s",
                                topic, exc)
                else:
                    old = self._cache.get(topic)
                    if old is not None and old.route != route:
                        log.info("route of %r changed: %s", topic, route.brokers)
                    self._cache[topic] = _Cached(route, time.monotonic())


def unreachable_message(nameservers: Sequence[str], topic: str, rounds: int,
                        last: TidemqError, elapsed_s: float | None = None) -> str:
    """One line for "no nameserver answered": where, how often, why, and what to check."""
    cause = last.__cause__
    why = f"{type(cause).__name__}: {cause}" if cause is not None else str(last)
    where = ", ".join(nameservers)
    over = f" over {elapsed_s:.1f}s" if elapsed_s is not None else ""
    return (f"cannot reach a nameserver to look up topic {topic!r}: tried {where}, "
            f"{rounds} time(s) each{over} (last error: {why}). Is the nameserver running? "
            "`make up` starts one; otherwise check the nameservers=[...] address")
