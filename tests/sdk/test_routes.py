from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from tidemq import ConfigurationError, RetryPolicy, TopicNotFoundError, TransportError
from tidemq._hedge import first_of
from tidemq._http import HttpClient
from tidemq._routes import RouteTable

from tests.sdk.fakes import FakeCluster

FAST = RetryPolicy(max_attempts=2, initial_backoff_s=0.001)


def _table(cluster: FakeCluster, **kw: Any) -> RouteTable:
    http = HttpClient(transport=cluster.transport, retry=FAST)
    return RouteTable(http, **kw)


async def test_route_from_any_nameserver(two_brokers: FakeCluster) -> None:
    two_brokers.down.add(two_brokers.nameservers[0])
    table = _table(two_brokers, nameservers=two_brokers.nameservers)
    route = await table.get("orders")
    assert [b.broker_name for b in route.brokers] == ["broker-0", "broker-1"]
    assert len(route.read_queues()) == 8
    await table.get("orders")  # cached
    assert len(two_brokers.requests_to("/v1/routes/orders")) == 2


async def test_unknown_topic_and_all_nameservers_down(two_brokers: FakeCluster) -> None:
    table = _table(two_brokers, nameservers=two_brokers.nameservers)
    with pytest.raises(TopicNotFoundError):
        await table.get("missing")
    two_brokers.down.update(two_brokers.nameservers)
    with pytest.raises(TransportError):
        await table.get("orders")


async def test_concurrent_misses_share_one_lookup_and_invalidate_refetches(
    cluster: FakeCluster,
) -> None:
    table = _table(cluster, nameservers=cluster.nameservers)
    routes = await asyncio.gather(*(table.get("orders") for _ in range(20)))
    assert len({id(r) for r in routes}) == 1
    assert len(cluster.requests_to("/v1/routes/orders")) == 1
    assert table.fresh("orders") is routes[0]  # what get answers without a lookup
    table.invalidate("orders")
    assert table.fresh("orders") is None and table.fresh("other") is None
    await table.get("orders")
    assert len(cluster.requests_to("/v1/routes/orders")) == 2
    assert table.fresh("orders") is not None


async def test_background_refresh_picks_up_new_queues(cluster: FakeCluster) -> None:
    table = _table(cluster, nameservers=cluster.nameservers, refresh_interval_s=0.01)
    table.start()
    assert len((await table.get("orders")).read_queues()) == 4
    cluster.broker.queues["orders"].extend([[], []])
    for _ in range(100):
        await asyncio.sleep(0.01)
        if len((await table.get("orders")).read_queues()) == 6:
            break
    assert len((await table.get("orders")).read_queues()) == 6
    await table.close()


async def test_direct_broker_asks_the_broker_for_the_topic(cluster: FakeCluster) -> None:
    table = _table(cluster, broker_url=cluster.broker_url)
    route = await table.get("orders")
    assert route.addresses == [cluster.broker_url] and len(route.write_queues()) == 4
    assert cluster.requests_to("/v1/topics/orders", "GET")


def test_exactly_one_of_nameservers_or_broker_url(cluster: FakeCluster) -> None:
    with pytest.raises(ConfigurationError):
        _table(cluster)
    with pytest.raises(ConfigurationError):
        _table(cluster, nameservers=["http://ns:1"], broker_url="http://b:1")


async def test_a_stale_route_is_kept_while_no_nameserver_answers(cluster: FakeCluster) -> None:
    table = _table(cluster, nameservers=cluster.nameservers)
    route = await table.get("orders")
    table.invalidate("orders")
    cluster.down.update(cluster.nameservers)
    assert await table.get("orders") is route
    cluster.down.clear()
    cluster.broker.queues.pop("orders")
    table.invalidate("orders")
    with pytest.raises(TopicNotFoundError):
        await table.get("orders")
    assert table.cached("orders") is None


async def test_an_impatient_lookup_asks_each_nameserver_once(two_brokers: FakeCluster) -> None:
    """A consumer's own retry topic usually does not exist yet: its lookup must not retry with
    back-off (a young nameserver answers 503 for unknown topics) and hold up the start."""
    two_brokers.down.update(two_brokers.nameservers)
    table = _table(two_brokers, nameservers=two_brokers.nameservers)
    with pytest.raises(TransportError, match="1 time"):
        await table.get("orders", patient=False)
    assert len(two_brokers.requests_to("/v1/routes/orders")) == len(two_brokers.nameservers)
    with pytest.raises(TransportError, match=f"{FAST.max_attempts} time"):
        await table.get("orders")
    assert len(two_brokers.requests_to("/v1/routes/orders")) == \
        len(two_brokers.nameservers) * (1 + FAST.max_attempts)


async def test_a_silent_nameserver_is_hedged_not_waited_out(two_brokers: FakeCluster) -> None:
    """The first nameserver takes the lookup and answers nothing (cut off, packets dropped):
    the second is asked after NAMESERVER_HEDGE_S and its answer wins; the silent ask is
    cancelled, not waited out to its timeout (NAMESERVER_TIMEOUT_S)."""
    silent = two_brokers.nameservers[0]
    serve = two_brokers.transport.handle_async_request
    held: list[str] = []
    cancelled = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        if f"{request.url.scheme}://{request.url.host}:{request.url.port}" == silent:
            held.append(request.url.path)
            try:
                await asyncio.Event().wait()  # never answers
            except asyncio.CancelledError:
                cancelled.set()
                raise
        return await serve(request)

    http = HttpClient(transport=httpx.MockTransport(handler), retry=FAST)
    table = RouteTable(http, nameservers=two_brokers.nameservers)
    route = await table.get("orders")
    assert [b.broker_name for b in route.brokers] == ["broker-0", "broker-1"]
    assert held == ["/v1/routes/orders"] and cancelled.is_set()
    table.invalidate("orders")
    await table.get("orders")  # from the one that answered: the silent one is not asked
    assert held == ["/v1/routes/orders"]


async def test_first_of_asks_the_next_on_failure_at_once_and_reports_every_failure() -> None:
    failures: list[tuple[int, str]] = []

    async def refuse() -> str:
        raise OSError("refused")

    async def answer() -> str:
        return "route"

    won = await first_of([refuse, refuse, answer], 60.0,
                         lambda i, e: failures.append((i, str(e))))
    assert won == (2, "route") and failures == [(0, "refused"), (1, "refused")]
    assert await first_of([refuse], 60.0, lambda i, e: None) is None

    def stop(i: int, e: BaseException) -> None:
        raise e

    with pytest.raises(OSError):
        await first_of([refuse, answer], 60.0, stop)
