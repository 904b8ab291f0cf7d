"""The base of every client: its connections, and start / close as an async context manager.

A client builds its HTTP client, route table and broker health with ``_connect``. ``close``
runs once: the client's own ``_shutdown`` (finishing its work, bounded), then the connections
are released even when that failed. ``async with client`` starts it and closes it on the way out.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from types import TracebackType
from typing import Self

from tidemq._auth import Credentials
from tidemq._constants import BROKER_BACKOFF_INITIAL_S
from tidemq._exceptions import ConfigurationError
from tidemq._fault import BrokerHealth
from tidemq._http import HttpClient, RetryPolicy, Transport
from tidemq._routes import RouteTable
from tidemq._validate import Endpoints, endpoints


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
