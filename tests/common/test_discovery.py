"""tidemq_server.common.discovery: reading /v1/cluster, asking nameservers in turn, following a
group that moves; and BrokerClient following its resolver. Unit tests over httpx's MockTransport
(a fake clock drives the refresh intervals)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import httpx
import msgpack
import pytest

from tidemq_server.common.broker_client import BrokerClient, BrokerDown
from tidemq_server.common.discovery import (
    BrokerResolver,
    ClusterView,
    GroupUnknown,
    Nameservers,
    NoNameserver,
    fetch_groups,
    fetch_groups_async,
    parse_cluster,
)
from tidemq_server.common.settings import GroupServiceSettings

NS1, NS2 = "http://ns1:9876", "http://ns2:9876"


def entry(name: str, address: str, **extra: Any) -> dict[str, Any]:
    return {"cluster": "c", "broker_name": name, "address": address, **extra}


class Fake:
    """Nameservers and brokers behind one MockTransport. ``cluster[ns]`` is what nameserver
    ``ns`` lists (None: it refuses connections); ``brokers[address]`` the broker name answering
    at that address (absent: connection refused)."""

    def __init__(self) -> None:
        self.cluster: dict[str, list[dict[str, Any]] | None] = {NS1: [], NS2: []}
        self.brokers: dict[str, str] = {}
        self.replicas: set[str] = set()  # broker addresses answering 503 NOT_PRIMARY
        self.asked: Counter[str] = Counter()
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def handle(self, request: httpx.Request) -> httpx.Response:
        origin = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        self.asked[origin] += 1
        if request.url.path == "/v1/cluster":
            listed = self.cluster.get(origin)
            if listed is None:
                raise httpx.ConnectError("refused", request=request)
            return httpx.Response(200, json={"brokers": listed, "nameservers": list(self.cluster)})
        name = self.brokers.get(origin)
        if name is None:
            raise httpx.ConnectError("refused", request=request)
        if origin in self.replicas:
            return httpx.Response(503, json={"code": "NOT_PRIMARY", "message": "a replica"})
        return httpx.Response(200, content=msgpack.packb({"broker_name": name, "at": origin}),
                              headers={"content-type": "application/msgpack"})

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def resolver(self, name: str = "broker-a", retry_s: float = 0.5,
                 **kw: Any) -> BrokerResolver:
        return BrokerResolver(name, [NS1, NS2], transport=self.transport(), clock=self.clock,
                              refresh_s=5.0, retry_s=retry_s, **kw)


def test_parse_cluster_reads_primaries_and_tolerates_missing_fields() -> None:
    groups = parse_cluster({"brokers": [
        entry("broker-a", "http://a:1/"),  # no broker_id, role, epoch, grpc_address: a primary
        entry("broker-b", "http://b:1", broker_id=0, role="primary", epoch=1,
              grpc_address="b:8081", max_offset=10, topics={"T": {"queues": 4, "perm": "rw"}}),
        entry("broker-b", "http://b2:1", broker_id=1, role="replica", epoch=1),
        entry("broker-c", "http://c-old:1", role="primary", epoch=1),
        entry("broker-c", "http://c-new:1", role="primary", epoch=2),
        entry("broker-d", "http://d:1", broker_id=1),  # a replica told by its id alone
        {"broker_name": "", "address": "http://x:1"}, {"broker_name": "e"}, "junk",
        entry("broker-f", "http://f:1", grpc_address=None, epoch="bad"),
    ]})
    assert sorted(groups) == ["broker-a", "broker-b", "broker-c", "broker-f"]
    assert groups["broker-a"].address == "http://a:1" and groups["broker-a"].grpc_address is None
    b = groups["broker-b"]
    assert (b.address, b.grpc_address, b.epoch) == ("http://b:1", "b:8081", 1)
    assert b.topics == {"T": {"queues": 4, "perm": "rw"}}
    assert groups["broker-c"].address == "http://c-new:1"  # the higher epoch wins
    assert groups["broker-f"].epoch == 0
    with pytest.raises(ValueError, match="brokers"):
        parse_cluster({"routes": []})


def test_parse_cluster_prefers_the_address_for_the_deployments_own_services() -> None:
    groups = parse_cluster({"brokers": [
        entry("broker-a", "https://127.0.0.1:10911", internal_address="https://broker-a:10911/"),
        entry("broker-b", "https://127.0.0.1:11911", internal_address=None),
    ]})
    assert groups["broker-a"].address == "https://broker-a:10911"
    assert groups["broker-b"].address == "https://127.0.0.1:11911"


def test_nameservers_are_asked_in_turn_and_the_last_good_one_first() -> None:
    fake = Fake()
    fake.cluster[NS1] = None
    fake.cluster[NS2] = [entry("broker-a", "http://a:1")]
    ns = Nameservers(f" {NS1}/ ,{NS2},")
    assert ns.urls == [NS1, NS2]
    assert list(fetch_groups(ns, transport=fake.transport())) == ["broker-a"]
    assert fake.asked == Counter({NS1: 1, NS2: 1})
    fetch_groups(ns, transport=fake.transport())
    assert fake.asked[NS2] == 2 and fake.asked[NS1] == 1  # NS2 answered: it is asked first
    fake.cluster[NS2] = None
    with pytest.raises(NoNameserver, match=r"ns1.*ns2|ns2.*ns1"):
        fetch_groups(ns, transport=fake.transport())


def test_a_nameserver_without_the_group_does_not_end_the_search() -> None:
    fake = Fake()
    fake.cluster[NS1] = [entry("broker-b", "http://b:1")]  # restarted: has not heard broker-a
    fake.cluster[NS2] = [entry("broker-a", "http://a:1"), entry("broker-b", "http://b:1")]
    found = fetch_groups(Nameservers([NS1, NS2]), want="broker-a", transport=fake.transport())
    assert "broker-a" in found
    fake.cluster[NS2] = [entry("broker-b", "http://b:1")]
    found = fetch_groups(Nameservers([NS1, NS2]), want="broker-a", transport=fake.transport())
    assert list(found) == ["broker-b"]  # nobody has it: the first answer


async def test_resolver_caches_refreshes_and_follows_a_move() -> None:
    fake = Fake()
    fake.cluster[NS1] = [entry("broker-a", "http://a:1"), entry("broker-b", "http://b:1")]
    resolver = fake.resolver()
    try:
        assert resolver.discovered
        assert await resolver.address() == "http://a:1"
        assert await resolver.address() == "http://a:1"
        assert fake.asked[NS1] == 1  # cached
        fake.cluster[NS1] = [entry("broker-a", "http://a:2")]
        fake.now = 4.9
        assert await resolver.address() == "http://a:1"
        assert fake.asked[NS1] == 1
        fake.now = 5.0  # past refresh_s: answered from the cache, refreshed in the background
        assert await resolver.address() == "http://a:1"
        assert resolver.view is not None and resolver.view._flight is not None
        await resolver.view._flight
        assert await resolver.address() == "http://a:2"
        assert fake.asked[NS1] == 2
    finally:
        await resolver.close()


async def test_resolver_after_a_failure_asks_again_at_most_every_retry_interval() -> None:
    fake = Fake()
    fake.cluster[NS1] = [entry("broker-a", "http://a:1")]
    resolver = fake.resolver()
    try:
        await resolver.address()
        fake.cluster[NS1] = [entry("broker-a", "http://a:9")]
        fake.now = 1.0
        resolver.invalidate()
        assert await resolver.address() == "http://a:9"  # waited for the nameservers
        resolver.invalidate()
        fake.now = 1.2
        assert await resolver.address() == "http://a:9"
        assert fake.asked[NS1] == 2  # within retry_s of the last request: not asked
        fake.cluster[NS1] = []  # it left the routes (a clean stop): its last address is kept
        fake.now = 2.0
        assert await resolver.address() == "http://a:9"
        assert fake.asked[NS1] == 3
    finally:
        await resolver.close()


async def test_a_group_no_nameserver_lists_is_unknown() -> None:
    fake = Fake()
    fake.cluster[NS1] = [entry("broker-b", "http://b:1")]
    resolver = fake.resolver("broker-a")
    try:
        with pytest.raises(GroupUnknown, match="broker-a"):
            await resolver.address()
        asked = sum(fake.asked.values())
        with pytest.raises(GroupUnknown):
            await resolver.address()
        assert sum(fake.asked.values()) == asked  # not asked again within retry_s
        fake.cluster[NS1] = None
        fake.cluster[NS2] = None
        fake.now = 1.0
        with pytest.raises(GroupUnknown, match="ConnectError"):
            await resolver.address()
    finally:
        await resolver.close()


async def test_fixed_url_without_nameservers() -> None:
    resolver = BrokerResolver("", "", "http://fixed:1/")
    assert not resolver.discovered
    assert await resolver.address() == "http://fixed:1"
    resolver.invalidate()
    await resolver.close()
    with pytest.raises(ValueError, match="broker_name"):
        BrokerResolver("", "http://ns:1")
    with pytest.raises(ValueError, match="broker_url"):
        BrokerResolver("broker-a", "")


def test_group_settings_need_a_name_with_nameservers(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="broker_name"):
        GroupServiceSettings(nameservers="http://ns:1")
    s = GroupServiceSettings(nameservers="http://ns1:1/, http://ns2:1", broker_name="broker-b",
                             broker_url="http://x:1/")
    assert s.nameserver_urls == ["http://ns1:1", "http://ns2:1"] and s.broker_url == "http://x:1"
    assert s.resolver().discovered
    assert not GroupServiceSettings().resolver().discovered


async def test_view_keeps_the_known_groups_when_every_nameserver_fails() -> None:
    fake = Fake()
    fake.cluster[NS2] = [entry("broker-a", "http://a:1"), entry("broker-b", "http://b:1")]
    view = ClusterView([NS1, NS2], transport=fake.transport(), clock=fake.clock)
    try:
        assert sorted(await view.groups()) == ["broker-a", "broker-b"]
        fake.cluster[NS1] = fake.cluster[NS2] = None
        view.invalidate()
        fake.now = 10.0
        assert sorted(await view.groups()) == ["broker-a", "broker-b"]
        assert "ConnectError" in view.error
    finally:
        await view.close()


async def test_broker_client_follows_its_group() -> None:
    fake = Fake()
    fake.cluster[NS1] = [entry("broker-a", "http://a:1")]
    fake.brokers["http://a:1"] = "broker-a"
    client = BrokerClient("", "token", resolver=fake.resolver(), transport=fake.transport())
    try:
        assert (await client.call("GET", "/x"))["at"] == "http://a:1"
        # the broker dies and comes back on another port; the nameservers learn it
        del fake.brokers["http://a:1"]
        fake.brokers["http://a:2"] = "broker-a"
        fake.cluster[NS1] = [entry("broker-a", "http://a:2")]
        with pytest.raises(BrokerDown, match="a:1"):
            await client.call("GET", "/x")
        fake.now = 1.0  # past retry_s: the failure made the resolver ask again
        assert (await client.call("GET", "/x"))["at"] == "http://a:2"
        assert client.base_url == "http://a:2"
        fake.cluster[NS1] = []
        fake.cluster[NS2] = []
    finally:
        await client.close()
    lost = BrokerClient("", "token", resolver=fake.resolver("broker-z"),
                        transport=fake.transport())
    try:
        with pytest.raises(BrokerDown, match="broker-z") as err:
            await lost.call("GET", "/x")
        assert err.value.maybe_done is False  # nothing was sent
    finally:
        await lost.close()


async def test_broker_client_follows_its_group_when_the_old_primary_answers_not_primary(
        ) -> None:
    """A failover leaves the old primary up as a replica (a planned restart, a deposed or
    fenced primary): its NOT_PRIMARY makes the client ask the nameservers again before the next
    call, not after ``refresh_s`` (issue 32: timers through a failover)."""
    fake = Fake()
    fake.cluster[NS1] = [entry("broker-a", "http://a:1")]
    fake.brokers.update({"http://a:1": "broker-a", "http://a:2": "broker-a"})
    client = BrokerClient("", "token", resolver=fake.resolver(), transport=fake.transport())
    try:
        assert (await client.call("GET", "/x"))["at"] == "http://a:1"
        fake.replicas.add("http://a:1")
        fake.cluster[NS1] = [entry("broker-a", "http://a:2")]
        with pytest.raises(BrokerDown, match="NOT_PRIMARY") as err:
            await client.call("GET", "/x")
        assert err.value.code == "NOT_PRIMARY" and err.value.maybe_done
        fake.now = 1.0  # past retry_s, far before refresh_s
        assert (await client.call("GET", "/x"))["at"] == "http://a:2"
    finally:
        await client.close()


async def test_a_view_that_waits_for_fresh_answers_never_serves_an_old_one() -> None:
    fake = Fake()
    fake.cluster[NS1] = [entry("broker-a", "http://a:1")]
    view = ClusterView([NS1], wait_fresh=True, refresh_s=3.0, transport=fake.transport(),
                       clock=fake.clock)
    try:
        assert list(await view.groups()) == ["broker-a"]
        fake.cluster[NS1] = [entry("broker-a", "http://a:1"), entry("broker-b", "http://b:1")]
        fake.now = 2.9
        assert list(await view.groups()) == ["broker-a"]  # young enough: cached
        fake.now = 30.0  # a route query 30 s later gets today's groups, not the cached ones
        assert sorted(await view.groups()) == ["broker-a", "broker-b"]
        assert fake.asked[NS1] == 2
    finally:
        await view.close()


async def test_concurrent_callers_share_one_request_and_its_answer() -> None:
    fake = Fake()
    fake.cluster[NS1] = [entry("broker-a", "http://a:1")]
    resolver = fake.resolver()
    try:
        answers = await asyncio.gather(*(resolver.address() for _ in range(5)))
        assert answers == ["http://a:1"] * 5
        assert fake.asked[NS1] == 1
    finally:
        await resolver.close()


class Hanging(Fake):
    """``Fake``, and brokers that take a request and answer nothing (``hung``: a paused primary,
    or one cut off from this host) until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.hung: set[str] = set()
        self.release = asyncio.Event()
        self.held = 0  # requests a hung broker took
        self.release_after = 0  # the hung brokers answer once NS1 was asked this often (0: no)

    def handle(self, request: httpx.Request) -> httpx.Response:
        resp = super().handle(request)
        if self.release_after and self.asked[NS1] >= self.release_after:
            self.release.set()
        return resp

    def broker_transport(self) -> httpx.MockTransport:
        async def handle(request: httpx.Request) -> httpx.Response:
            origin = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
            if origin in self.hung:
                self.held += 1
                await self.release.wait()
            return self.handle(request)
        return httpx.MockTransport(handle)


async def test_broker_client_leaves_a_silent_primary_once_the_nameservers_name_another() -> None:
    """Issue 32: a primary paused or cut off from the scheduler answers nothing; the request
    to it is abandoned (``maybe_done``: retried strict at the new primary) as soon as the
    nameservers list the group's new primary, not after the client's 30 s timeout."""
    fake = Hanging()
    fake.cluster[NS1] = [entry("broker-a", "http://a:1")]
    fake.brokers.update({"http://a:1": "broker-a", "http://a:2": "broker-a"})
    client = BrokerClient("", "token", resolver=fake.resolver(),
                          transport=fake.broker_transport(), moved_check_s=0.01)
    try:
        assert (await client.call("GET", "/x"))["at"] == "http://a:1"
        fake.hung.add("http://a:1")
        fake.cluster[NS1] = [entry("broker-a", "http://a:2")]  # elected while a:1 is silent
        fake.now = 1.0  # past retry_s: the resolver may ask the nameservers again
        with pytest.raises(BrokerDown, match="primary is http://a:2 now") as err:
            await client.call("POST", "/internal/v1/schedule/deliver", body=b"\x80")
        assert err.value.maybe_done and fake.held == 1
        assert (await client.call("GET", "/x"))["at"] == "http://a:2"
    finally:
        fake.release.set()
        await client.close()


async def test_broker_client_waits_for_a_slow_primary_that_is_still_the_primary() -> None:
    """A slow answer from the group's primary is awaited: the nameservers are asked while it
    is outstanding, and as long as they name the same primary the request stands."""
    fake = Hanging()
    fake.cluster[NS1] = [entry("broker-a", "http://a:1")]
    fake.brokers["http://a:1"] = "broker-a"
    client = BrokerClient("", "token", resolver=fake.resolver(retry_s=0.0),
                          transport=fake.broker_transport(), moved_check_s=0.01)
    try:
        await client.call("GET", "/x")
        fake.hung.add("http://a:1")
        fake.release_after = 3  # it answers once the nameservers were asked twice meanwhile
        assert (await client.call("GET", "/x"))["at"] == "http://a:1"
        assert fake.held == 1
    finally:
        fake.release.set()
        await client.close()


async def test_a_silent_nameserver_is_hedged_not_waited_out() -> None:
    """NS1 takes the request and answers nothing (cut off): NS2 is asked after
    DISCOVERY_HEDGE_S and its answer is used; NS1's request is cancelled, not waited out."""
    fake = Fake()
    fake.cluster[NS2] = [entry("broker-a", "http://a:1")]
    cancelled = asyncio.Event()

    async def handle(request: httpx.Request) -> httpx.Response:
        if request.url.host == "ns1":
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise
        return fake.handle(request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as http:
        ns = Nameservers([NS1, NS2])
        found = await fetch_groups_async(http, ns, want="broker-a")
        assert list(found) == ["broker-a"] and cancelled.is_set()
        assert ns.in_turn() == [NS2, NS1]  # the one that answered is asked first next time
        # an answer without the group wanted does not end the search: the next is asked
        fake.cluster[NS1] = [entry("broker-b", "http://b:1")]
        found = await fetch_groups_async(http, Nameservers([NS1, NS2]), want="broker-a")
        assert "broker-a" in found
