"""Stepping aside (CheckQuorum, replication/aside.py) through a real etcd, with electors driving
fake roles and a fake view of the primary's replicas: a primary cut off from live members gives
the lead to the best of them, fence shut first, and follows it; it keeps the lead when they are
paused or dead; a successor must hold what the old primary acknowledged, else the old one runs
again once its hold is over."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from tests.broker.replication.test_election import LEASE_S, FakeRole, _crash, _stop_all
from tests.broker.replication.test_election import _elector as elector
from tests.support.etcd import EtcdServer
from tests.support.wait import quiet_for_async, wait_until_async
from tidemq_server.broker.replication.aside import CheckQuorum
from tidemq_server.broker.replication.election import Claim, Elector, GroupKeys, LeaseFence
from tidemq_server.common.etcd import EtcdClient, KeyValue

pytestmark = pytest.mark.integration

AFTER_S = 0.5  # step_aside_after_s of these electors
HOLD_S = 2.0  # their hold
QUIET_S = 4 * AFTER_S  # a claim "it keeps the lead": several thresholds pass


class View:
    """The primary's view of its replicas, set by the test (``Quorum.cut_off``, ``hwm``)."""

    def __init__(self) -> None:
        self.cut = False
        self.hwm = 0

    def cut_off(self) -> bool:
        return self.cut


class Successor(FakeRole):
    """Records whether the old primary's fence was still open when this one was promoted."""

    def __init__(self, offset: int, old_fence: LeaseFence) -> None:
        super().__init__(offset)
        self.old_fence = old_fence
        self.old_open_at_promotion: list[bool] = []

    async def promote(self, epoch: int) -> None:
        self.old_open_at_promotion.append(self.old_fence())
        await super().promote(epoch)


class Recording(EtcdClient):
    """An etcd client that keeps the member claims it writes and the leases it revokes, in
    order."""

    def __init__(self, endpoints: list[str]) -> None:
        super().__init__(endpoints)
        self.calls: list[tuple[str, Claim | int]] = []

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        revision = await super().put(key, value, lease)
        if "/members/" in key and (claim := Claim.decode(KeyValue(key, value, 0, 0, 0))):
            self.calls.append(("put", claim))
        return revision

    async def revoke(self, lease: int) -> None:
        await super().revoke(lease)
        self.calls.append(("revoke", lease))


@pytest.fixture
async def client(etcd: EtcdServer) -> AsyncIterator[Recording]:
    c = Recording([etcd.url])
    yield c
    await c.close()


def _elector(client: EtcdClient, role: FakeRole, group: str, broker_id: int, view: View,
             lease_s: float = LEASE_S) -> Elector:
    return elector(client, role, group, broker_id, lease_s, CheckQuorum(view, 2, AFTER_S, HOLD_S))


async def _member(client: EtcdClient, group: str, broker_id: int) -> Claim | None:
    kv = await client.get(GroupKeys("test", group).member(broker_id))
    return Claim.decode(kv) if kv is not None else None


async def test_a_primary_cut_off_from_live_members_hands_the_lead_to_the_best_of_them(
        client: Recording) -> None:
    group = f"g-{uuid.uuid4().hex[:6]}"
    old = FakeRole(offset=100)  # the most caught up: its unacknowledged tail past 90
    behind, best = Successor(80, old.fence), Successor(90, old.fence)
    views = [View(), View(), View()]
    electors = [_elector(client, r, group, i, views[i])
                for i, r in enumerate((old, behind, best))]
    for e in electors:
        e.start()
    try:
        await wait_until_async(lambda: bool(old.promoted) and bool(behind.demoted)
                               and bool(best.demoted), what="broker 0 leads, both follow")
        views[0].hwm = 90  # acknowledged: everything below 90, held by broker 2 too
        views[0].cut = True  # no fetch from either replica arrives any more
        lead_lease = electors[0].lease
        await wait_until_async(lambda: electors[0].check is not None
                               and electors[0].check.holding, what="broker 0 standing aside")
        assert not old.fence()
        await wait_until_async(lambda: bool(best.promoted), what="broker 2 elected")
        # its claim said "aside" (with what it acknowledged) before its old lease was revoked,
        # so the others' campaigns could not miss it
        calls = client.calls
        aside = next(i for i, (kind, c) in enumerate(calls)
                     if kind == "put" and isinstance(c, Claim) and c.broker_id == 0 and c.aside)
        assert calls[aside][1] == Claim(0, "http://127.0.0.1:20000", 1, 100, True, 90)
        assert calls.index(("revoke", lead_lease)) > aside
        assert best.promoted[0][0] == 2 and behind.promoted == []
        assert best.old_open_at_promotion == [False]  # the fence shut before the lease went
        # the old primary follows the new one, and the hold ends with that
        await wait_until_async(lambda: old.demoted[-1:] == [("http://127.0.0.1:20002", 2)],
                               what="broker 0 following broker 2")
        check = electors[0].check
        assert check is not None
        # well before its hold would end by itself (HOLD_S after it began)
        await wait_until_async(lambda: not check.holding, timeout=HOLD_S / 4,
                               what="the hold ended by following")
        assert len(old.promoted) == 1
        await wait_until_async(lambda: behind.demoted[-1] == ("http://127.0.0.1:20002", 2))
    finally:
        await _stop_all(electors)


async def test_a_primary_whose_replicas_are_paused_or_dead_keeps_the_lead(
        client: EtcdClient) -> None:
    group = f"g-{uuid.uuid4().hex[:6]}"
    roles = [FakeRole(offset=100), FakeRole(offset=90), FakeRole(offset=90)]
    views = [View(), View(), View()]
    # the replicas' leases outlast the test: their claims stay while they are "paused"
    electors = [_elector(client, r, group, i, views[i], LEASE_S if i == 0 else 60.0)
                for i, r in enumerate(roles)]
    for e in electors:
        e.start()
    try:
        await wait_until_async(lambda: bool(roles[0].promoted) and all(
            r.demoted for r in roles[1:]), what="broker 0 leads, both follow")
        for e in electors[1:]:
            await _crash(e)  # paused: claims still in etcd, never rewritten
        views[0].cut = True
        assert await quiet_for_async(lambda: (roles[0].fence(), len(roles[0].promoted)),
                                     QUIET_S, "broker 0's lead") == (True, 1)
        for e in electors[1:]:
            await e.stop()  # dead: their leases end, their claims go
        assert await _member(client, group, 1) is None
        assert await quiet_for_async(lambda: (roles[0].fence(), len(roles[0].promoted)),
                                     QUIET_S, "broker 0's lead") == (True, 1)
        assert electors[0].check is not None and not electors[0].check.holding
    finally:
        await _stop_all(electors)


async def test_nobody_below_what_it_acknowledged_runs_and_it_runs_again_after_the_hold(
        client: EtcdClient) -> None:
    """A primary that stepped aside while no live replica holds its acknowledged records (a
    view this test forces: 100 acknowledged, replicas at 80 and 90): nobody is elected in its
    place, and once its hold is over it is elected again (losing nothing)."""
    group = f"g-{uuid.uuid4().hex[:6]}"
    roles = [FakeRole(offset=100), FakeRole(offset=80), FakeRole(offset=90)]
    views = [View(), View(), View()]
    electors = [_elector(client, r, group, i, views[i]) for i, r in enumerate(roles)]
    for e in electors:
        e.start()
    try:
        await wait_until_async(lambda: bool(roles[0].promoted) and all(
            r.demoted for r in roles[1:]), what="broker 0 leads, both follow")
        views[0].hwm = 100
        views[0].cut = True
        check = electors[0].check
        assert check is not None
        await wait_until_async(lambda: check.holding, what="broker 0 standing aside")
        views[0].cut = False  # the cut heals meanwhile
        await wait_until_async(lambda: len(roles[0].promoted) == 2,
                               what="broker 0 elected again after its hold")
        assert roles[0].promoted[1][0] == 2
        assert roles[1].promoted == [] and roles[2].promoted == []
        assert roles[0].promoted[1][1] - roles[0].promoted[0][1] >= HOLD_S
        await wait_until_async(lambda: all(r.demoted[-1] == ("http://127.0.0.1:20000", 2)
                                           for r in roles[1:]), what="both follow it again")
    finally:
        await _stop_all(electors)
