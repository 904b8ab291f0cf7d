"""The role seam with a static controller: promote, demote, depose, fence."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemq_server.broker.replication.epochs import EpochEntry, EpochFile
from tidemq_server.broker.replication.role import BrokerRole, Role, StaleEpochError, static_role


class Hooks:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def stop_following(self) -> None:
        self.calls.append("stop")

    async def start_following(self, primary_address: str) -> None:
        self.calls.append(f"follow {primary_address}")

    async def became_primary(self) -> None:
        self.calls.append("primary")


def make(tmp_path: Path, role: str, broker_id: int = 0, end: int = 0) -> BrokerRole:
    return static_role(EpochFile(tmp_path / "e.json"), "http://self", lambda: end, role,
                       broker_id, "http://p/")


def test_static_roles_from_settings(tmp_path: Path) -> None:
    p = make(tmp_path / "a", "", broker_id=0)
    assert p.role == Role.PRIMARY and p.epoch == 1 and p.primary_address == "http://self"
    assert p.epochs.entries == [EpochEntry(1, 0)] and p.may_write()
    r = make(tmp_path / "b", "", broker_id=1)
    assert r.role == Role.REPLICA and r.primary_address == "http://p" and not r.may_write()
    assert "replica" in r.why_not_writable() and "http://p" in r.why_not_writable()
    forced = make(tmp_path / "c", "replica", broker_id=0)
    assert forced.role == Role.REPLICA
    plain = static_role(EpochFile(tmp_path / "d" / "e.json"), "http://s", lambda: 0, "", 0, "",
                        replicated=False)
    assert plain.epoch == 0 and plain.is_primary and not (tmp_path / "d").exists()


async def test_promote_records_the_epoch_at_the_log_end(tmp_path: Path) -> None:
    r = make(tmp_path, "replica", broker_id=1, end=4096)
    hooks = Hooks()
    r.hooks = hooks
    seen: list[str] = []
    r.add_listener(lambda: seen.append(r.role.value))
    await r.promote(2)
    assert r.role == Role.PRIMARY and r.epoch == 2 and r.primary_address == "http://self"
    assert r.epochs.entries[-1] == EpochEntry(2, 4096)
    assert hooks.calls == ["stop", "primary"] and seen == ["primary"]
    await r.promote(2)  # idempotent
    assert seen == ["primary"]
    with pytest.raises(StaleEpochError):
        await r.promote(1)


async def test_demote_stops_writes_and_follows(tmp_path: Path) -> None:
    p = make(tmp_path, "primary")
    hooks = Hooks()
    p.hooks = hooks
    await p.demote("http://new/", 3)
    assert p.role == Role.REPLICA and p.epoch == 3 and p.primary_address == "http://new"
    assert hooks.calls == ["follow http://new"] and not p.may_write()
    with pytest.raises(StaleEpochError):
        await p.demote("http://old", 2)


def test_fence_and_depose(tmp_path: Path) -> None:
    p = make(tmp_path, "primary")
    held = [True]
    p.fence = lambda: held[0]
    assert p.may_write()
    held[0] = False
    assert not p.may_write() and "lease" in p.why_not_writable()
    held[0] = True

    def broken() -> bool:
        raise RuntimeError("etcd gone")

    p.fence = broken
    assert not p.may_write()
    p.fence = lambda: True
    p.depose(1)  # same epoch: not deposed
    assert p.may_write()
    p.depose(2)
    assert p.deposed and not p.may_write() and "newer epoch" in p.why_not_writable()


async def test_promote_forgets_terms_learned_past_the_bytes_held(tmp_path: Path) -> None:
    r = make(tmp_path, "replica", broker_id=1, end=500)
    r.epochs.adopt([EpochEntry(1, 0), EpochEntry(2, 800)], upto=900)  # then the chunk failed
    await r.promote(3)
    assert r.epochs.entries == [EpochEntry(1, 0), EpochEntry(3, 500)]
