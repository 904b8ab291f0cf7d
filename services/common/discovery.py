"""Finding broker groups through the nameservers' ``GET /v1/cluster``.

A broker group is a ``broker_name``. The checker and the scheduler serve one group each, the
metrics sidecar reads every group, and the broker's gRPC door lists every group's queues; all of
them learn where the groups are from the nameservers instead of from a fixed URL:

- ``Nameservers``: the configured URLs, asked in turn starting with the last one that answered;
- ``parse_cluster``: one ``/v1/cluster`` answer → the primary of each group (``Group``). Only
  ``broker_name`` and ``address`` are required of an entry; ``grpc_address``, ``broker_id``,
  ``role`` and ``epoch`` are read when a nameserver sends them;
- ``ClusterView`` (async): every group, cached; refreshed in the background once older than
  ``refresh_s``, so a caller waits for the nameservers only when nothing is known yet;
- ``BrokerResolver`` (async): one group's addresses on top of a ``ClusterView``, re-resolved
  every ``refresh_s`` and soon after a failed call (``invalidate``); with no nameservers it is
  the fixed ``broker_url``;
- ``fetch_groups`` (blocking): every group once, for Spark's driver.

A nameserver that answers without the wanted group, or without any group, (it restarted and
has not heard every heartbeat yet) does not end the search: the next one is asked too.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from tidemq._hedge import first_of

from tidemq_server.common.auth.client import service_auth
from tidemq_server.common.constants import (
    CLUSTER_PATH,
    DISCOVERY_HEDGE_S,
    DISCOVERY_REFRESH_S,
    DISCOVERY_RETRY_S,
    DISCOVERY_TIMEOUT_S,
)
from tidemq_server.common.tls import client_context

log = logging.getLogger(__name__)

PRIMARY = "primary"
JSON_HEADERS = {"accept": "application/json"}


class NoNameserver(Exception):
    """No nameserver gave a usable answer."""


class GroupUnknown(Exception):
    """The wanted broker group is not registered with any nameserver that answered."""


@dataclass(frozen=True, slots=True)
class Group:
    """Where one broker group's primary listens, as the nameservers last heard."""

    broker_name: str
    address: str  # REST base URL, e.g. http://127.0.0.1:10911
    grpc_address: str | None = None  # host:port of its gRPC door; None when it has none
    epoch: int = 0  # the group's leadership term (0 without replication)
    last_heartbeat_ms: int = 0
    topics: Mapping[str, Mapping[str, Any]] | None = None  # {topic: {queues, perm}}


def split_urls(value: str | Iterable[str]) -> list[str]:
    """Comma-separated (or listed) base URLs, trimmed, without trailing slashes."""
    items = value.split(",") if isinstance(value, str) else value
    return [u.strip().rstrip("/") for u in items if u and u.strip()]


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _is_primary(entry: Mapping[str, Any]) -> bool:
    role = entry.get("role")
    if role is not None:
        return str(role) == PRIMARY
    return _int(entry.get("broker_id"), 0) == 0


def parse_cluster(answer: Any) -> dict[str, Group]:
    """A ``/v1/cluster`` answer → broker name → its primary. Entries without a name or an
    address, and replicas, are left out; of two primaries of one group the higher epoch, then
    the newer heartbeat, wins. Raises ValueError when the answer has no ``brokers`` list."""
    brokers = answer.get("brokers") if isinstance(answer, Mapping) else None
    if not isinstance(brokers, list):
        raise ValueError("not a /v1/cluster answer: no 'brokers' list")
    groups: dict[str, Group] = {}
    for entry in brokers:
        if not isinstance(entry, Mapping) or not _is_primary(entry):
            continue
        # the services of the deployment use the broker's internal address when it has one
        name = entry.get("broker_name")
        address = entry.get("internal_address") or entry.get("address")
        if not isinstance(name, str) or not name or not isinstance(address, str) or not address:
            continue
        grpc = entry.get("grpc_address")
        topics = entry.get("topics")
        group = Group(broker_name=name, address=address.rstrip("/"),
                      grpc_address=grpc if isinstance(grpc, str) and grpc else None,
                      epoch=_int(entry.get("epoch")),
                      last_heartbeat_ms=_int(entry.get("last_heartbeat_ms")),
                      topics=topics if isinstance(topics, Mapping) else None)
        known = groups.get(name)
        if known is None or (group.epoch, group.last_heartbeat_ms) > (known.epoch,
                                                                        known.last_heartbeat_ms):
            groups[name] = group
    return groups


class Nameservers:
    """The nameserver URLs, in the order to ask them: the last one that answered first."""

    def __init__(self, urls: str | Iterable[str]) -> None:
        self.urls = split_urls(urls)
        self._good = 0

    def __bool__(self) -> bool:
        return bool(self.urls)

    def in_turn(self) -> list[str]:
        n = len(self.urls)
        return [self.urls[(self._good + i) % n] for i in range(n)]

    def answered(self, url: str) -> None:
        self._good = self.urls.index(url)


class _Search:
    """One pass over the nameservers, in turn, until one answers with what is wanted.

    Iterating gives the URLs still to ask; ``answer``/``fail`` note what each one did, and the
    pass ends at the first answer that lists ``want`` (any group when ``want`` is None).
    ``result`` picks that answer, else the first answer; raises NoNameserver when no
    nameserver answered.
    """

    def __init__(self, nameservers: Nameservers, want: str | None) -> None:
        self.nameservers = nameservers
        self.want = want
        self.results: list[tuple[str, Any]] = []  # (url, groups or the error text)
        self._done = False

    def __iter__(self) -> Iterator[str]:
        for url in self.nameservers.in_turn():
            if self._done:
                return
            yield url

    def answer(self, url: str, resp: httpx.Response) -> None:
        try:
            if resp.status_code != 200:
                raise ValueError(f"{url}{CLUSTER_PATH}: HTTP {resp.status_code}")
            groups = parse_cluster(resp.json())
        except (httpx.HTTPError, ValueError) as exc:
            self.fail(url, exc)
            return
        self.results.append((url, groups))
        self._done = self._enough(groups)

    @property
    def done(self) -> bool:
        """An answer listed what is wanted: the pass is over."""
        return self._done

    def fail(self, url: str, exc: Exception) -> None:
        self.results.append((url, f"{type(exc).__name__}: {exc}"))

    def _enough(self, groups: dict[str, Group]) -> bool:
        return self.want in groups if self.want is not None else bool(groups)

    def result(self) -> dict[str, Group]:
        answers = [(url, r) for url, r in self.results if isinstance(r, dict)]
        for url, groups in answers:
            if self._enough(groups):
                self.nameservers.answered(url)
                return groups
        if answers:
            url, groups = answers[0]
            self.nameservers.answered(url)
            return groups
        raise NoNameserver("; ".join(f"{url}: {r}" for url, r in self.results)
                           or "none configured")


class _AskOn(Exception):
    """A nameserver answered without the group wanted: the search goes on."""


async def fetch_groups_async(http: httpx.AsyncClient, nameservers: Nameservers,
                             want: str | None = None) -> dict[str, Group]:
    """Ask the nameservers in turn until one answers (and lists ``want``, when given), the next
    one too once the last has gone ``DISCOVERY_HEDGE_S`` unanswered (``tidemq._hedge``): a
    nameserver cut off costs that much, not its timeout."""
    search = _Search(nameservers, want)
    order = nameservers.in_turn()

    async def ask(url: str) -> None:
        search.answer(url, await http.get(url + CLUSTER_PATH, headers=JSON_HEADERS))
        if not search.done:
            raise _AskOn

    def failed(i: int, exc: BaseException) -> None:
        if isinstance(exc, httpx.HTTPError):
            search.fail(order[i], exc)
        elif not isinstance(exc, _AskOn):
            raise exc

    await first_of([functools.partial(ask, url) for url in order], DISCOVERY_HEDGE_S, failed)
    return search.result()


def fetch_groups(nameservers: Nameservers, timeout_s: float = DISCOVERY_TIMEOUT_S,
                 want: str | None = None, *,
                 transport: httpx.BaseTransport | None = None) -> dict[str, Group]:
    """``fetch_groups_async``, blocking (Spark's driver)."""
    search = _Search(nameservers, want)
    with httpx.Client(timeout=timeout_s, transport=transport, verify=client_context(),
                      auth=service_auth()) as http:
        for url in search:
            try:
                search.answer(url, http.get(url + CLUSTER_PATH, headers=JSON_HEADERS))
            except httpx.HTTPError as exc:
                search.fail(url, exc)
    return search.result()


class ClusterView:
    """Every group, as the nameservers last answered; safe to share between tasks.

    ``groups()`` answers from the cache while it is younger than ``refresh_s``. Past that it
    still answers at once and refreshes in the background, unless ``wait_fresh`` (callers that
    ask rarely, like a client's route query, must not get an answer as old as their last
    call): then it waits for the nameservers. It also waits when nothing is known yet or after
    ``invalidate()``; it asks at most once per ``retry_s`` (concurrent callers share one
    request). When every nameserver fails, the last known groups stay in use.
    """

    def __init__(self, nameservers: str | Iterable[str], *, want: str | None = None,
                 wait_fresh: bool = False,
                 refresh_s: float = DISCOVERY_REFRESH_S, retry_s: float = DISCOVERY_RETRY_S,
                 timeout_s: float = DISCOVERY_TIMEOUT_S,
                 transport: httpx.AsyncBaseTransport | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.nameservers = Nameservers(nameservers)
        self.want = want
        self.wait_fresh = wait_fresh
        self.refresh_s = refresh_s
        self.retry_s = retry_s
        self.clock = clock
        self.http = httpx.AsyncClient(timeout=timeout_s, transport=transport,
                                      verify=client_context(), auth=service_auth())
        self.known: dict[str, Group] | None = None
        self.asked_at = -1e18  # clock() of the last request (answered or not)
        self.answered_at = -1e18  # clock() of the last answer
        self.stale = False  # invalidate() was called since the last answer
        self.error = ""  # why the last request failed ("" after an answer)
        self._flight: asyncio.Task[None] | None = None

    async def groups(self) -> dict[str, Group]:
        """Every known group (empty while no nameserver ever answered)."""
        now = self.clock()
        old = now - self.answered_at >= self.refresh_s
        if self.known is None or self.stale or (old and self.wait_fresh):
            if self._flight is not None and not self._flight.done():
                await asyncio.shield(self._flight)  # a request is out: share its answer
            elif now - self.asked_at >= self.retry_s:
                await self._refresh()
        elif old and now - self.asked_at >= self.retry_s:
            self._start()
        return self.known or {}

    def invalidate(self) -> None:
        """A call to an address from here failed: ask the nameservers before the next one."""
        self.stale = True

    async def _refresh(self) -> None:
        self._start()
        assert self._flight is not None
        await asyncio.shield(self._flight)

    def _start(self) -> None:
        if self._flight is None or self._flight.done():
            self.asked_at = self.clock()
            self._flight = asyncio.create_task(self._ask(), name="cluster-view")

    async def _ask(self) -> None:
        try:
            groups = await fetch_groups_async(self.http, self.nameservers, self.want)
        except NoNameserver as exc:
            if self.error != str(exc):
                log.warning("no nameserver answered (%s); %s", exc,
                            "keeping the groups known before" if self.known
                            else "nothing is known yet")
            self.error = str(exc)
            return
        if self.error:
            log.info("nameservers answer again: %d group(s)", len(groups))
        self.error = ""
        self.known = groups
        self.answered_at = self.clock()
        self.stale = False

    async def close(self) -> None:
        if self._flight is not None and not self._flight.done():
            self._flight.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flight
        await self.http.aclose()


class BrokerResolver:
    """One broker group's current primary: found through the nameservers by ``broker_name``,
    or the fixed ``fixed_url`` when no nameservers are given."""

    def __init__(self, broker_name: str, nameservers: str | Sequence[str] = "",
                 fixed_url: str = "", *, refresh_s: float = DISCOVERY_REFRESH_S,
                 retry_s: float = DISCOVERY_RETRY_S, timeout_s: float = DISCOVERY_TIMEOUT_S,
                 transport: httpx.AsyncBaseTransport | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.broker_name = broker_name
        self.fixed_url = fixed_url.rstrip("/")
        self.view: ClusterView | None = None
        if split_urls(nameservers):
            if not broker_name:
                raise ValueError("finding a broker through nameservers needs its broker_name")
            self.view = ClusterView(nameservers, want=broker_name, refresh_s=refresh_s,
                                    retry_s=retry_s, timeout_s=timeout_s, transport=transport,
                                    clock=clock)
        elif not self.fixed_url:
            raise ValueError("give either nameservers (and a broker_name) or a broker_url")
        self.current: Group | None = None

    @property
    def discovered(self) -> bool:
        """True when the address comes from the nameservers, False for a fixed URL."""
        return self.view is not None

    def describe(self) -> str:
        if self.view is None:
            return self.fixed_url
        where = self.current.address if self.current else "not found yet"
        return (f"{self.broker_name} via nameservers {', '.join(self.view.nameservers.urls)} "
                f"({where})")

    async def group(self) -> Group:
        """The group's primary now; raises GroupUnknown when no nameserver lists it."""
        if self.view is None:
            return Group(self.broker_name, self.fixed_url)
        found = (await self.view.groups()).get(self.broker_name)
        if found is None:
            self.view.invalidate()  # keep asking (at most every retry_s) until it is listed
            if self.current is not None:  # it left the routes: keep trying its last address
                return self.current
            detail = self.view.error or "registered with none of them"
            raise GroupUnknown(f"broker {self.broker_name!r} is not known to the nameservers "
                               f"{', '.join(self.view.nameservers.urls)} ({detail})")
        if self.current is None:
            log.info("broker %s found at %s", self.broker_name, found.address)
        elif found.address != self.current.address:
            log.warning("broker %s moved: %s -> %s", self.broker_name, self.current.address,
                        found.address)
        self.current = found
        return found

    async def address(self) -> str:
        """The group's REST base URL."""
        return (await self.group()).address

    def invalidate(self) -> None:
        """A call to the current address failed (no connection, timeout): resolve again."""
        if self.view is not None:
            self.view.invalidate()

    async def close(self) -> None:
        if self.view is not None:
            await self.view.close()
