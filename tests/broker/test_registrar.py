"""NameserverRegistrar against real nameserver processes."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.procs import ServiceProcess, free_port
from tests.support.wait import TIMEOUT_S
from tidemq_server.broker.registrar import NameserverRegistrar

pytestmark = pytest.mark.integration


def start_nameserver(workdir: Path) -> ServiceProcess:
    port = free_port()
    return ServiceProcess("nameserver", port, {"TIDEMQ_NAMESRV_PORT": str(port)}, workdir).start()


@pytest.fixture(scope="module")
def nameservers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServiceProcess]]:
    procs = [start_nameserver(tmp_path_factory.mktemp(f"ns{i}")) for i in range(2)]
    yield procs
    for proc in procs:
        proc.stop()


class Topics:
    """The broker's topic table, as the registrar's topics_provider sees it."""

    def __init__(self, **topics: int) -> None:
        self.topics = {name: {"queues": n, "perm": "rw"} for name, n in topics.items()}

    def __call__(self) -> dict[str, dict[str, Any]]:
        return dict(self.topics)


def make_registrar(urls: list[str], name: str, topics: Topics,
                   interval_s: float = 30.0) -> NameserverRegistrar:
    return NameserverRegistrar(urls, cluster="c1", broker_name=name,
                               address=f"http://127.0.0.1:{free_port()}",
                               topics_provider=topics, interval_s=interval_s)


async def route(url: str, topic: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=5.0) as client:
        return await client.get(f"{url}/v1/routes/{topic}")


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


async def test_register_now_reaches_every_nameserver(nameservers: list[ServiceProcess]) -> None:
    urls = [ns.url for ns in nameservers]
    topics = Topics(**{"reg-orders": 4})
    registrar = make_registrar(urls, "reg-a", topics)
    try:
        assert await registrar.register_now() == dict.fromkeys(urls, True)
        for url in urls:
            resp = await route(url, "reg-orders")
            assert resp.status_code == 200
            [queue] = resp.json()["queues"]
            assert queue == {"broker_name": "reg-a", "address": registrar.address,
                             "queues": 4, "perm": "rw", "replicas": []}

        topics.topics["reg-new"] = {"queues": 2, "perm": "r"}  # a topic is created
        await registrar.register_now()
        for url in urls:
            assert (await route(url, "reg-new")).json()["queues"][0]["perm"] == "r"
    finally:
        await registrar.stop()


async def test_one_nameserver_down_does_not_break_the_other(
        nameservers: list[ServiceProcess]) -> None:
    """A nameserver that takes connections and never answers does not hold up the heartbeat
    to the live one: the live one has the route while the other request is still waiting."""
    live = nameservers[0].url
    silent = socket.create_server(("127.0.0.1", 0))  # the kernel accepts; nobody answers
    hung = f"http://127.0.0.1:{silent.getsockname()[1]}"
    registrar = NameserverRegistrar([hung, live], cluster="c1", broker_name="reg-b",
                                    address=f"http://127.0.0.1:{free_port()}",
                                    topics_provider=Topics(**{"reg-partial": 1}),
                                    timeout_s=3600.0)  # the hung request waits for good
    try:
        registering = asyncio.create_task(registrar.register_now())
        while (await route(live, "reg-partial")).status_code != 200:
            assert not registering.done(), registering.result()
            await asyncio.sleep(0.05)
        assert not registering.done()  # the hung nameserver still holds its request
        silent.close()  # now it fails (connection reset)
        assert await registering == {hung: False, live: True}
    finally:
        silent.close()
        await registrar.stop()


async def test_periodic_heartbeat_and_unregister_on_stop(
        nameservers: list[ServiceProcess]) -> None:
    url = nameservers[1].url
    topics = Topics(**{"reg-periodic": 1})
    registrar = make_registrar([url], "reg-c", topics, interval_s=0.1)
    registrar.start()
    try:
        await wait_for_route(url, "reg-periodic")
        topics.topics["reg-later"] = {"queues": 1, "perm": "rw"}  # no register_now call
        await wait_for_route(url, "reg-later")
    finally:
        await registrar.stop()
    assert (await route(url, "reg-periodic")).status_code == 404  # left at once


async def test_request_heartbeat_wakes_the_loop(nameservers: list[ServiceProcess]) -> None:
    url = nameservers[0].url
    topics = Topics(**{"reg-wake": 1})
    registrar = make_registrar([url], "reg-d", topics, interval_s=3600)
    registrar.start()
    try:
        await wait_for_route(url, "reg-wake")  # the first heartbeat goes out at start
        topics.topics["reg-woken"] = {"queues": 1, "perm": "rw"}
        registrar.request_heartbeat()
        await wait_for_route(url, "reg-woken")
    finally:
        await registrar.stop()


async def test_nameserver_restart_is_caught_up_by_the_next_heartbeat(tmp_path: Path) -> None:
    ns = start_nameserver(tmp_path)
    registrar = make_registrar([ns.url], "reg-e", Topics(**{"reg-restart": 1}), interval_s=0.1)
    registrar.start()
    try:
        await wait_for_route(ns.url, "reg-restart")
        ns.stop()
        await asyncio.sleep(0.3)  # heartbeats fail meanwhile, and are only logged
        ns.start()
        await wait_for_route(ns.url, "reg-restart")
    finally:
        await registrar.stop()
        ns.stop()


async def wait_for_route(url: str, topic: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while (await route(url, topic)).status_code != 200:
        assert time.monotonic() < deadline, f"no route for {topic} on {url}"
        await asyncio.sleep(0.05)


async def test_a_missed_heartbeat_is_retried_within_seconds_not_an_interval(
        tmp_path: Path) -> None:
    port = free_port()
    ns = ServiceProcess("nameserver", port, {"TIDEMQ_NAMESRV_PORT": str(port),
                                             "TIDEMQ_NAMESRV_WARMUP_S": "0"}, tmp_path)
    registrar = make_registrar([ns.url], "reg-f", Topics(**{"reg-retry": 1}), interval_s=3600)
    registrar.start()  # the first heartbeat finds nobody listening
    try:
        await asyncio.sleep(0.3)
        assert not registrar.all_registered()
        ns.start()
        await wait_for_route(ns.url, "reg-retry")  # a retry: the interval is an hour
        assert registrar.all_registered()
    finally:
        await registrar.stop()
        ns.stop()
