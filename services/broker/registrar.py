"""The broker's link to the nameservers: register topics at once, then heartbeat periodically.

Every heartbeat carries the broker's full topic set (``topics_provider()``) and its place in the
cluster (group ``broker_name``, member ``broker_id``, ``role`` and ``epoch`` read from its
``standing`` at each heartbeat, gRPC address, commit log ``max_offset``), sent to every
nameserver concurrently. A clean stop says goodbye to every
nameserver (``DELETE /v1/brokers/{name}?broker_id=..&address=..``) so routes drop it at once.
A nameserver that is down is logged, never raised: the others keep serving routes, and the next
heartbeat catches the lagging one up.

Heartbeats to one nameserver are serialised and take their topic snapshot only once it is their
turn, so an older topic set can never overwrite a newer one there. Heartbeats and the goodbye
carry the cluster token (``X-Tidemq-Token``): a nameserver refuses registrations without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import quote

import httpx

from tidemq_server.common.auth.client import service_auth
from tidemq_server.common.constants import (
    BROKER_HEARTBEAT_INTERVAL_S,
    BROKER_HEARTBEAT_RETRY_S,
    TOKEN_HEADER,
)
from tidemq_server.common.loop import BackgroundLoop
from tidemq_server.common.tls import client_context

log = logging.getLogger(__name__)

TopicsProvider = Callable[[], dict[str, dict[str, Any]]]  # {topic: {"queues": n, "perm": "rw"}}
OffsetProvider = Callable[[], int]  # commit log max physical offset (bytes)

class Standing(Protocol):
    """This broker's place in its group (replication's ``BrokerRole``)."""

    @property
    def role(self) -> str: ...  # "primary" or "replica"

    @property
    def epoch(self) -> int: ...


HEARTBEAT_PATH = "/v1/brokers/heartbeat"
REQUEST_TIMEOUT_S = 3.0  # per heartbeat request to one nameserver


class _HeartbeatLoop(BackgroundLoop):
    name = "nameserver-heartbeat"

    def __init__(self, registrar: NameserverRegistrar, interval_s: float) -> None:
        super().__init__(interval_s)
        self.registrar = registrar

    async def run_once(self) -> None:
        await self.registrar.register_now()

    async def pause(self) -> None:
        """A nameserver that refused or missed the last heartbeat (just restarted, say) is
        tried again after ``BROKER_HEARTBEAT_RETRY_S``, so its routes are back within a second
        or so rather than a whole interval later."""
        if self.registrar.all_registered():
            await super().pause()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(),
                                   min(self.interval_s, BROKER_HEARTBEAT_RETRY_S))


class NameserverRegistrar:
    """Keeps this broker registered with every nameserver."""

    def __init__(self, nameserver_urls: list[str], cluster: str, broker_name: str, address: str,
                 topics_provider: TopicsProvider,
                 interval_s: float = BROKER_HEARTBEAT_INTERVAL_S,
                 timeout_s: float = REQUEST_TIMEOUT_S,
                 unregister_on_stop: bool = True, token: str = "", *, broker_id: int = 0,
                 standing: Standing | None = None, grpc_address: str | None = None,
                 internal_address: str | None = None,
                 max_offset_provider: OffsetProvider | None = None) -> None:
        self.nameserver_urls = [u.strip().rstrip("/") for u in nameserver_urls if u.strip()]
        self.cluster = cluster
        self.broker_name = broker_name
        self.address = address.rstrip("/")
        # the base URL the deployment's own services use; None when it is ``address``
        self.internal_address = internal_address.rstrip("/") if internal_address else None
        self.topics_provider = topics_provider
        self.broker_id = broker_id
        self.standing = standing  # None: a primary at epoch 0 (no replication)
        self.grpc_address = grpc_address  # host:port of the gRPC door; None while it has none
        self.max_offset_provider = max_offset_provider
        self.unregister_on_stop = unregister_on_stop
        headers = {TOKEN_HEADER: token} if token else {}
        self._client = httpx.AsyncClient(timeout=timeout_s, headers=headers,
                                         verify=client_context(), auth=service_auth())
        self._loop = _HeartbeatLoop(self, interval_s)
        self._locks = {url: asyncio.Lock() for url in self.nameserver_urls}
        self._reachable: dict[str, bool | None] = dict.fromkeys(self.nameserver_urls)

    def start(self) -> None:
        """Register now and then every ``interval_s`` (in a background task)."""
        if not self.nameserver_urls:
            log.warning("no nameservers configured: broker %s will not be routable",
                        self.broker_name)
            return
        log.info("registering broker %s (%s) with %s every %g s", self.broker_name,
                 self.address, ", ".join(self.nameserver_urls), self._loop.interval_s)
        self._loop.start()

    def advertise_grpc(self, address: str | None) -> None:
        """The gRPC door's address from now on (None: it has none); heartbeats at once when
        it changed."""
        if address != self.grpc_address:
            self.grpc_address = address
            self.request_heartbeat()

    def request_heartbeat(self) -> None:
        """Ask for a heartbeat soon without waiting for it (``register_now`` waits)."""
        self._loop.wakeup()

    async def stop(self) -> None:
        """Stop heartbeating; leave every nameserver's routes at once unless told not to."""
        await self._loop.stop()
        if self.unregister_on_stop and self.nameserver_urls:
            await asyncio.gather(*(self._unregister(url) for url in self.nameserver_urls))
        await self._client.aclose()

    async def register_now(self) -> dict[str, bool]:
        """Heartbeat every nameserver concurrently; answer which ones accepted it."""
        results = await asyncio.gather(*(self._heartbeat(url) for url in self.nameserver_urls))
        return dict(zip(self.nameserver_urls, results, strict=True))

    async def _heartbeat(self, url: str) -> bool:
        async with self._locks[url]:
            try:
                body = self.heartbeat_body()
            except Exception:
                log.exception("cannot list topics for the heartbeat to %s", url)
                return False
            try:
                resp = await self._client.post(url + HEARTBEAT_PATH, json=body)
            except httpx.HTTPError as exc:
                self._mark(url, False, f"{type(exc).__name__}: {exc}".rstrip(": "))
                return False
            if resp.status_code != 200:
                hint = ("; give the broker the nameserver's cluster token (TIDEMQ_BROKER_TOKEN "
                        "= TIDEMQ_NAMESRV_TOKEN)" if resp.status_code == 401 else "")
                self._mark(url, False, f"HTTP {resp.status_code}: {resp.text[:300]}{hint}")
                return False
            self._mark(url, True, f"{len(body['topics'])} topic(s)")
            return True

    def all_registered(self) -> bool:
        """True when every nameserver accepted the last heartbeat."""
        return all(self._reachable.values())

    def heartbeat_body(self) -> dict[str, Any]:
        """What one heartbeat says: the broker's full current state."""
        role, epoch = ((str(self.standing.role), self.standing.epoch)
                       if self.standing is not None else ("primary", 0))
        return {"cluster": self.cluster, "broker_name": self.broker_name,
                "broker_id": self.broker_id, "role": role, "epoch": epoch,
                "address": self.address, "internal_address": self.internal_address,
                "grpc_address": self.grpc_address,
                "max_offset": self.max_offset_provider() if self.max_offset_provider else 0,
                "topics": self.topics_provider()}

    def _mark(self, url: str, ok: bool, detail: str) -> None:
        """Log state changes loudly and repeats quietly, so a dead nameserver cannot flood."""
        before = self._reachable[url]
        self._reachable[url] = ok
        if ok and before is not True:
            log.info("registered with nameserver %s (%s)", url, detail)
        elif not ok and before is not False:
            log.warning("heartbeat to nameserver %s failed (%s); retrying every %g s",
                        url, detail, min(self._loop.interval_s, BROKER_HEARTBEAT_RETRY_S))
        else:
            log.debug("heartbeat to %s: %s", url, detail)

    async def _unregister(self, url: str) -> None:
        with contextlib.suppress(httpx.HTTPError):
            resp = await self._client.delete(f"{url}/v1/brokers/{quote(self.broker_name, safe='')}",
                                             params={"broker_id": self.broker_id,
                                                     "address": self.address}, timeout=1.0)
            if resp.status_code == 200:
                log.info("unregistered from nameserver %s", url)
            elif resp.status_code != 404:  # 404: already gone (expired, or never registered)
                log.warning("unregistering from nameserver %s failed: HTTP %d: %s", url,
                            resp.status_code, resp.text[:300])
