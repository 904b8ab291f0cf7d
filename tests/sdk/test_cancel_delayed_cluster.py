"""``cancel_delayed`` on real processes: a nameserver and two broker groups, each with its own
scheduler (redis-server shared). The SDK finds the group holding a delayed message with and
without the send result's ``broker_name``, leaves the same id in another topic pending, and
maps too late (409 ALREADY_DELIVERED) and unknown (404 MESSAGE_NOT_FOUND) to its errors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
from tidemq import (
    AlreadyDeliveredError,
    CancelState,
    MessageNotFoundError,
    Producer,
    SendResult,
)

from tests.scheduler.harness import DelayCluster, run_delay_cluster, unique
from tests.support.procs import RedisServer, ServiceProcess, free_port
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration

GROUPS = ("g-a", "g-b")
DELAY_MS = 600_000  # nothing is delivered while a test runs, unless it says so


class TwoGroups:
    def __init__(self, ns: ServiceProcess, groups: dict[str, DelayCluster]) -> None:
        self.ns = ns
        self.groups = groups

    def topic(self) -> str:
        name = unique("T")
        for g in self.groups.values():
            g.broker.create_topic(name, queues=2)
        wait_until(lambda: len(self.route(name)) == 2, 10, "both groups in the route")
        return name

    def route(self, topic: str) -> list[str]:
        resp = httpx.get(f"{self.ns.url}/v1/routes/{topic}")
        return [q["broker_name"] for q in resp.json().get("queues", [])] \
            if resp.status_code == 200 else []

    def state(self, r: SendResult) -> str:
        assert r.broker_name is not None
        g = self.groups[r.broker_name].broker
        return str(g.http.get(f"/v1/messages/{r.message_id}").json()["state"])

    def pending(self, group: str, topic: str) -> int:
        return int(self.groups[group].scheduled(topic)["pending"])


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer
        ) -> Iterator[TwoGroups]:
    workdir: Path = tmp_path_factory.mktemp("cancel-two-groups")
    port = free_port()
    cluster = unique("cluster")
    with ExitStack() as stack:
        ns = ServiceProcess("nameserver", port, {"TIDEMQ_NAMESRV_PORT": str(port)},
                            workdir).start()
        stack.callback(ns.stop)
        groups = {name: stack.enter_context(run_delay_cluster(
            workdir, redis_server.url, cluster=cluster, broker_name=name,
            nameservers=ns.url, scheduler={"tick_ms": "50"})) for name in GROUPS}
        yield TwoGroups(ns, groups)


async def send_until_both(p: Producer, topic: str, delay_ms: int = DELAY_MS
                          ) -> dict[str, SendResult]:
    """One delayed message stored on each group (the producer spreads sends over both)."""
    by_group: dict[str, SendResult] = {}
    for i in range(64):
        r = await p.send(f"later {i}", topic=topic, delay_ms=delay_ms)
        assert r.scheduled and r.broker_name in GROUPS
        by_group.setdefault(r.broker_name, r)
        if len(by_group) == 2:
            return by_group
    raise AssertionError(f"64 sends went to {sorted(by_group)} only")


async def test_cancel_finds_the_group_holding_the_message(two: TwoGroups) -> None:
    topic = two.topic()
    async with Producer(nameservers=[two.ns.url]) as p:
        sent = await send_until_both(p, topic)
        for r in sent.values():
            assert two.state(r) == "scheduled"  # the group named holds it
        # without a hint every group is asked; with one, that group first
        a, b = sent["g-a"], sent["g-b"]
        done = await p.cancel_delayed(topic, b.message_id)
        assert done.state is CancelState.CANCELLED and done.broker_name == "g-b"
        done = await p.cancel_delayed(topic, a.message_id, broker_name=a.broker_name)
        assert done.broker_name == "g-a"
        assert two.state(a) == "cancelled" and two.state(b) == "cancelled"
        again = await p.cancel_delayed(topic, a.message_id)  # idempotent
        assert again.state is CancelState.CANCELLED
        with pytest.raises(MessageNotFoundError):
            await p.cancel_delayed(topic, unique("never-sent"))


async def test_the_same_id_in_another_topic_stays_pending(two: TwoGroups) -> None:
    one, other = two.topic(), two.topic()
    mid = unique("twin")
    async with Producer(nameservers=[two.ns.url]) as p:
        first = await p.send(b"1", topic=one, message_id=mid, delay_ms=DELAY_MS)
        second = await p.send(b"2", topic=other, message_id=mid, delay_ms=DELAY_MS)
        assert first.broker_name and second.broker_name
        wait_until(lambda: two.pending(str(second.broker_name), other) == 1, 10, "counted")
        await p.cancel_delayed(one, mid, broker_name=first.broker_name)
        assert two.pending(str(first.broker_name), one) == 0
        assert two.pending(str(second.broker_name), other) == 1


async def test_too_late_is_already_delivered(two: TwoGroups) -> None:
    topic = two.topic()
    async with Producer(nameservers=[two.ns.url]) as p:
        sent = await send_until_both(p, topic, delay_ms=300)
        wait_until(lambda: all(two.state(r) == "stored" for r in sent.values()), 10,
                   "the deliveries")
        for r in sent.values():
            with pytest.raises(AlreadyDeliveredError):
                await p.cancel_delayed(topic, r.message_id)
