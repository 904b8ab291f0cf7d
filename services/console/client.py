"""The console's one I/O seam: calls to nameservers, brokers and sidecars over HTTP.

Calls made while serving a signed-in person (ACL on) are signed with that person's account
(``sessions.acting_as``); the sampler's, and every call with ACL off, with the console's own.
Every failure becomes ``ApiError`` (code, message, the URL asked) so a page can show it; a
service that cannot be reached is ``UNAVAILABLE``. Internal endpoints carry the cluster token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from tidemq_server.common.auth.client import service_auth
from tidemq_server.common.constants import CLUSTER_PATH, TOKEN_HEADER
from tidemq_server.common.tls import client_context
from tidemq_server.console.sessions import acting_as


class ApiError(Exception):
    """A call that did not answer 2xx: the service's ``{code, message}`` or why it failed."""

    def __init__(self, code: str, message: str, url: str = "") -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.url = code, message, url


@dataclass
class LiveBroker:
    """A live broker as the nameservers list it."""

    name: str
    address: str
    role: str
    broker_id: int
    last_heartbeat_ms: int
    topics: dict[str, Any]
    max_offset: int
    epoch: int = 0


def segment(name: str) -> str:
    """A topic, group or id as one URL path segment (``%`` of ``%DLQ%`` escaped)."""
    return quote(name, safe="")


class ConsoleClient:
    def __init__(self, nameservers: list[str], token: str, timeout_s: float,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.nameservers = nameservers
        self.token = token
        self.http = httpx.AsyncClient(timeout=timeout_s, transport=transport,
                                      headers={"user-agent": "tidemq-console"},
                                      verify=client_context(), auth=service_auth())

    async def close(self) -> None:
        await self.http.aclose()

    async def call(self, method: str, url: str, *, internal: bool = False,
                   params: dict[str, Any] | None = None, json: Any = None) -> Any:
        headers = {TOKEN_HEADER: self.token} if internal and self.token else None
        person = acting_as.get()  # a signed-in person's account (ACL on), else the console's
        try:
            resp = await self.http.request(method, url, params=params, json=json,
                                           headers=headers,
                                           auth=httpx.USE_CLIENT_DEFAULT if person is None
                                           else person)
        except httpx.HTTPError as exc:
            raise ApiError("UNAVAILABLE", f"cannot reach {url}: {exc or type(exc).__name__}",
                           url) from exc
        if resp.is_success:
            return resp.json() if resp.content else {}
        try:
            body = resp.json()
            code, message = str(body["code"]), str(body["message"])
        except (ValueError, KeyError, TypeError):
            code, message = f"HTTP_{resp.status_code}", resp.text[:300]
        raise ApiError(code, message, url)

    async def health(self, base: str) -> tuple[bool, str, float]:
        """(healthy, what it said, seconds taken) of ``base/healthz``."""
        start = time.perf_counter()
        try:
            answer = await self.call("GET", f"{base}/healthz")
            return True, str(answer.get("status", "ok")), time.perf_counter() - start
        except ApiError as exc:
            return False, f"{exc.code}: {exc.message}", time.perf_counter() - start

    async def cluster(self) -> tuple[str, dict[str, Any]]:
        """The first nameserver that answers, and its ``GET /v1/cluster``."""
        errors = []
        for ns in self.nameservers:
            try:
                return ns, await self.call("GET", f"{ns}{CLUSTER_PATH}")
            except ApiError as exc:
                errors.append(str(exc))
        raise ApiError("UNAVAILABLE", "no nameserver answered: " + "; ".join(errors)
                       if errors else "no nameservers configured (TIDEMQ_CONSOLE_NAMESERVERS)")

    async def brokers(self, primaries_only: bool = True) -> list[LiveBroker]:
        _, answer = await self.cluster()
        found = [LiveBroker(str(b.get("broker_name", "")),
                        str(b.get("internal_address") or b.get("address", "")),
                        str(b.get("role", "primary")), int(b.get("broker_id", 0)),
                        int(b.get("last_heartbeat_ms", 0)), dict(b.get("topics") or {}),
                        int(b.get("max_offset", 0)), int(b.get("epoch") or 0))
                 for b in answer.get("brokers", [])]
        if primaries_only:
            found = [b for b in found if b.role == "primary"]
        return sorted(found, key=lambda b: (b.name, b.broker_id))
