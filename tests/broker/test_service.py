"""The broker's composition root (``Broker.start``) builds every part once, by constructors:
nothing reaches into a part afterwards and changes its attributes.

The test watches every attribute write into an object of a ``tidemq_server.broker`` class (data
classes, enums, models and exceptions aside) and notes the writes made by code that is not the
object's own (the writing frame's ``self`` is another object, or there is none). It then runs a
replicated broker led through a real etcd (it starts as a replica and its elector promotes it)
through start, the promotion, sends (plain, repeated, delayed, transactional), a stop and a
restart (elected again), and requires that no part of either broker was written from outside. On
the wiring this replaced (``store.put`` replaced by the writer's and then the gate's,
``role.hooks``, ``role.fence``, ``delays.on_first_delay``, ``tx.table`` swapped on promotion,
``registrar.role`` pushed, ...) it lists each of those.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pydantic import BaseModel

import tidemq_server.broker.service as service_module
from tests.support.etcd import EtcdServer
from tests.support.procs import RedisServer
from tests.support.wait import wait_until_async
from tidemq_server.broker.service import Broker
from tidemq_server.broker.settings import BrokerSettings
from tidemq_server.broker.transactions.model import TxAction
from tidemq_server.broker.transactions.requests import EndRequest

pytestmark = pytest.mark.integration

HOST = "127.0.0.1:1"


@dataclasses.dataclass(frozen=True)
class Write:
    target: object  # kept alive, so that its id is not reused while the test runs
    attribute: str
    where: str

    def __str__(self) -> str:
        return f"{type(self.target).__qualname__}.{self.attribute} set by {self.where}"


def _part_classes() -> list[type]:
    """Classes of ``tidemq_server.broker`` whose instances are parts (not data)."""
    found: dict[type, None] = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("tidemq_server.broker") or not isinstance(module, ModuleType):
            continue
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != name or dataclasses.is_dataclass(cls) or issubclass(
                    cls, (enum.Enum, BaseException, BaseModel, tuple)):
                continue
            if getattr(cls, "_is_protocol", False):
                continue
            found[cls] = None
    return list(found)


class OutsideWrites:
    """Every attribute write into a part made by code other than the part's own methods."""

    def __init__(self) -> None:
        self.writes: list[Write] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        writes = self.writes

        def watched(obj: object, name: str, value: Any) -> None:
            frame = sys._getframe(1)
            if frame.f_locals.get("self") is not obj:
                code = frame.f_code
                where = f"{code.co_qualname} ({Path(code.co_filename).name}:{frame.f_lineno})"
                writes.append(Write(obj, name, where))
            object.__setattr__(obj, name, value)

        for cls in _part_classes():
            if "__setattr__" not in vars(cls):
                monkeypatch.setattr(cls, "__setattr__", watched)

    def into(self, parts: set[int]) -> list[str]:
        return sorted({str(w) for w in self.writes if id(w.target) in parts})


def parts_of(root: object) -> set[int]:
    """Ids of every part reachable from ``root`` through attributes (and their lists)."""
    classes = tuple(_part_classes())
    seen: dict[int, object] = {}
    todo = [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen[id(obj)] = obj
        for value in _attributes(obj):
            items = value.values() if isinstance(value, dict) else (
                value if isinstance(value, (list, tuple, set)) else (value,))
            todo.extend(v for v in items if isinstance(v, classes))
    return set(seen)


def _attributes(obj: object) -> Iterator[Any]:
    yield from getattr(obj, "__dict__", {}).values()
    for cls in type(obj).__mro__:
        for slot in getattr(cls, "__slots__", ()):
            if hasattr(obj, slot):
                yield getattr(obj, slot)


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path_factory.mktemp("etcd")).start()
    yield server
    server.stop()


def _settings(tmp_path: Path, redis_url: str, etcd_url: str) -> BrokerSettings:
    return BrokerSettings(
        data_dir=tmp_path / "broker", redis_url=redis_url, cluster="wiring", grpc_enabled=False,
        replicas=2, min_insync=1, replication="async", nameservers="", etcd_endpoints=etcd_url,
        lease_s=2.0, lease_margin_s=0.5, election_interval_s=0.1, auto_create_topics=True,
        flush_interval_ms=50)


async def _exercise(broker: Broker) -> None:
    """Writes through every service that writes: plain, repeated, delayed, transactional."""
    one = {"messages": [{"message_id": "m-1", "body": "a"}]}
    await broker.sender.send("Orders", one, HOST)
    await broker.sender.send("Orders", one, HOST)  # answered by dedup
    await broker.sender.send("Orders", {"messages": [{"body": "later", "delay_ms": 60_000}]},
                             HOST)
    half = await broker.transactions.begin(
        {"producer_group": "pg", "topic": "Orders", "message": {"body": "tx"}}, HOST)
    await broker.transactions.end("pg", [EndRequest(half["transaction_id"], TxAction.COMMIT)])


async def _run(settings: BrokerSettings) -> set[int]:
    """One broker's life: start, election (a promotion), every kind of write, stop; its parts."""
    broker = Broker(settings)
    await broker.start()
    try:
        await wait_until_async(broker.role.may_write, what="elected primary")
        await _exercise(broker)
    finally:
        parts = parts_of(broker)
        await broker.stop()
    return parts


async def test_nothing_rewires_a_part_after_it_is_built(
        tmp_path: Path, redis_server: RedisServer, etcd: EtcdServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert service_module  # every tidemq_server.broker module the root builds from is imported
    watch = OutsideWrites()
    watch.install(monkeypatch)
    settings = _settings(tmp_path, redis_server.url, etcd.url)
    parts = await _run(settings)
    parts |= await _run(settings)  # a restart: the same data directory, elected again
    assert len(parts) > 40  # the walk found the parts (store, writer, role, services, ...)
    outside = watch.into(parts)
    assert not outside, "written from outside:\n" + "\n".join(outside)
