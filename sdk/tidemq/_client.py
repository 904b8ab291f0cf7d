"""The base of every client: its connections, and start / close as an async context manager.

A client builds its HTTP client, route table and broker health with ``_connect``. ``close``
runs once: the client's own ``_shutdown`` (finishing its work, bounded), then the connections
are released even when that failed. ``async with client`` starts it and closes it on the way out.

The senders (``Producer``, ``TransactionProducer``) send through ``tidemq._send``, which uses
``_retarget`` and ``_give_up_at`` from here. Any other idempotent call to the brokers of a topic
(e.g. ending a transaction) goes through ``_retry_call``: one attempt per route, retried with
back-off until the policy's one deadline, the route asked for again after a failure that may
mean it changed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Self, TypeVar

from tidemq._auth import Credentials
from tidemq._constants import BROKER_BACKOFF_INITIAL_S
from tidemq._exceptions import (
    ConfigurationError,
    NotEnoughReplicasError,
    NotPrimaryError,
    TidemqError,
    TransportError,
)
from tidemq._fault import BrokerHealth, primary_hint
from tidemq._http import HttpClient, Transport
from tidemq._retry import RetryPolicy, pause_after
from tidemq._routes import MessageQueue, RouteTable, TopicRoute
from tidemq._validate import Endpoints, endpoints

log = logging.getLogger("tidemq.client")


T = TypeVar("T")

#: failures after which a call asks for its topic's route again: the broker may be gone or moved
_ROUTE_MAY_HAVE_CHANGED = (TransportError, NotPrimaryError, NotEnoughReplicasError)


class Client(ABC):
    """An HTTP client, a route table (started by ``start``) and the health of each broker."""

    _http: HttpClient
    _routes: RouteTable
    _health: BrokerHealth
    _endpoints: Endpoints
    _closed = False

    def _connect(
        self,
        *,
        nameservers: str | Sequence[str] | None,
        broker_url: str | None,
        request_timeout_s: float,
        retry: RetryPolicy,
        route_refresh_s: float,
        transport: Transport | None,
        backoff_max_s: float,
        credentials: Credentials | None = None,
    ) -> None:
        """Build the connections; a failing broker backs off up to ``backoff_max_s``.

        Routes come from ``nameservers`` (one URL, comma-separated URLs or a list) or from
        ``broker_url``; with neither, from the nameservers TIDEMQ_NAMESERVER_URL names
        (``tidemq._validate.endpoints``). Requests are signed with ``credentials`` (else
        TIDEMQ_ACCESS_KEY / TIDEMQ_SECRET_KEY, if set); https:// servers are verified against
        TIDEMQ_TLS_CA when it is set (``tidemq._http.shared_ssl_context``)."""
        self._endpoints = endpoints(nameservers, broker_url)
        if credentials is not None and not isinstance(credentials, Credentials):
            raise ConfigurationError(f"credentials: must be a tidemq.Credentials, got "
                                     f"{type(credentials).__name__}")
        self._http = HttpClient(transport=transport, timeout_s=request_timeout_s, retry=retry,
                                credentials=credentials)
        self._routes = RouteTable(self._http, nameservers=self._endpoints.nameservers or None,
                                  broker_url=self._endpoints.broker_url,
                                  refresh_interval_s=route_refresh_s)
        self._health = BrokerHealth(initial_s=BROKER_BACKOFF_INITIAL_S, max_s=backoff_max_s,
                                    probe_timeout_s=request_timeout_s)

    def _address_of(self, topic: str, broker_name: str | None) -> str | None:
        """The address of group ``broker_name`` in ``topic``'s cached route (for tracing)."""
        route = self._routes.cached(topic)
        for broker in route.brokers if route is not None else ():
            if broker.broker_name == broker_name:
                return broker.address
        return self._endpoints.broker_url

    def _give_up_at(self, started: float) -> float:
        """When a call that began at ``started`` (``time.monotonic()``) stops retrying."""
        deadline = self._http.retry.deadline_s
        return started + deadline if deadline is not None else float("inf")

    async def _retry_call(self, topic: str, request: Callable[[TopicRoute], Awaitable[T]], *,
                          what: str, group: str | None = None) -> T:
        """An idempotent call to the brokers of ``topic`` that is not a send (e.g. a cancel):
        ``request(route)`` makes ONE attempt (``retry=NO_RETRY``) against the broker it picks
        from the topic's current route; a retriable failure is retried with the policy's
        back-off (capped at about a second, jittered) until its one deadline, the route asked
        for again after a failure that may mean the broker is gone or moved. With ``group``
        (the broker group the call is for), a NOT_PRIMARY answer naming a primary the route
        knows is followed at once (``_retarget`` gives the group's current address). The error
        that ends it says how many attempts over how long (``gave_up``); ``what`` names the call
        in the debug log."""
        policy = self._http.retry
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            route = await self._routes.known_route(topic, self._give_up_at(started))
            try:
                return await request(route)
            except TidemqError as exc:
                pause = pause_after(policy, exc, attempt, time.monotonic() - started)
                hint = primary_hint(exc) if group is not None else None
                if hint is not None and group is not None \
                        and self._routes.follow_primary(topic, group, hint):
                    pause = 0.0  # the new primary is known: no need to wait
                elif isinstance(exc, _ROUTE_MAY_HAVE_CHANGED):
                    self._routes.invalidate(topic)
                log.debug("%s failed (attempt %d): %s; again in %.3fs", what, attempt, exc, pause)
                await asyncio.sleep(pause)

    @staticmethod
    def _retarget(route: TopicRoute, queue: MessageQueue) -> MessageQueue:
        """``queue`` again (``Step.SAME``), at its group's current writable address."""
        return route.writable_queue(queue.broker_name, queue.queue_id) or queue

    @abstractmethod
    async def start(self) -> Self:
        """Open what the client needs (routes, loops); each client says what."""

    async def close(self) -> None:
        """Finish what the client is doing (bounded) and release its connections; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._shutdown()
        finally:
            await self._routes.close()
            await self._http.aclose()

    @abstractmethod
    async def _shutdown(self) -> None:
        """The client's part of ``close``, before its connections are released."""

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
