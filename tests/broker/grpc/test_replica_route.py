"""A replica's gRPC door routes its own group's queues to the group's primary (as the
nameservers name it), so RocketMQ clients follow a failover; a primary's door lists itself."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tidemq.protocol import Perm

from tidemq_server.broker.grpc.routing import shares
from tidemq_server.common.discovery import Group

TOPIC = "orders"


class FakeView:
    def __init__(self, groups: dict[str, Group]) -> None:
        self._groups = groups

    async def groups(self) -> dict[str, Group]:
        return self._groups


def _door(is_primary: bool) -> Any:
    cfg = SimpleNamespace(queues=4, perm=Perm.READ_WRITE,
                          system=False)
    broker = SimpleNamespace(
        role=SimpleNamespace(is_primary=is_primary),
        settings=SimpleNamespace(broker_name="broker-a", auto_create_topics=False),
        topics=SimpleNamespace(get=lambda name: cfg, require=lambda name: cfg))
    view = FakeView({
        "broker-a": Group("broker-a", "http://primary:1", grpc_address="primary-host:8181",
                          epoch=3, topics={TOPIC: {"queues": 4, "perm": "rw"}}),
        "broker-b": Group("broker-b", "http://b:1", grpc_address="b-host:8182",
                          topics={TOPIC: {"queues": 2, "perm": "rw"}})})
    return SimpleNamespace(broker=broker, cluster=view,
                           endpoints=lambda: "this-door")


async def test_a_replica_door_routes_its_group_to_the_primary() -> None:
    found = await shares(_door(is_primary=False), TOPIC)
    assert [(s.broker_name, s.queues) for s in found] == [("broker-a", 4), ("broker-b", 2)]
    assert found[0].endpoints.addresses[0].host == "primary-host"
    assert found[0].endpoints.addresses[0].port == 8181


async def test_a_primary_door_lists_itself() -> None:
    found = await shares(_door(is_primary=True), TOPIC)
    assert found[0].broker_name == "broker-a" and found[0].endpoints == "this-door"
