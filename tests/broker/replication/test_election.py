"""The election against a real etcd: first leader, best offset wins, lease lapse, fencing."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.etcd import EtcdServer
from tests.support.wait import TIMEOUT_S, quiet_for_async, wait_until_async
from tidemq_server.broker.replication.aside import CheckQuorum
from tidemq_server.broker.replication.election import (
    Claim,
    Elector,
    GroupKeys,
    LeaseFence,
    best_member,
)
from tidemq_server.common.etcd import EtcdClient, KeyValue
from tidemq_server.common.loop import cancel_tasks

pytestmark = pytest.mark.integration

LEASE_S = 2.0
MARGIN_S = 0.5
INTERVAL_S = 0.2
# A lease no wait of these tests outlasts (s): a successor elected within a wait was handed the
# lead (a revoke), it did not wait for a lapse.
LONG_LEASE_S = 3 * TIMEOUT_S


class FakeRole:
    """The role seam (replication/role.py) reduced to what the election drives."""

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset
        self.epoch = 0
        self.fence = LeaseFence()  # the elector moves it
        self.promoted: list[tuple[int, float]] = []  # (epoch, monotonic time)
        self.demoted: list[tuple[str, int]] = []
        self.leads = True  # may_lead: False while it copies back records it cut

    async def promote(self, epoch: int) -> None:
        self.promoted.append((epoch, time.monotonic()))
        self.epoch = epoch

    async def demote(self, primary_address: str, epoch: int) -> None:
        self.demoted.append((primary_address, epoch))
        self.epoch = epoch

    def last_offset(self) -> int:
        return self.offset

    def may_lead(self) -> bool:
        return self.leads


@pytest.fixture
async def client(etcd: EtcdServer) -> AsyncIterator[EtcdClient]:
    c = EtcdClient([etcd.url])
    yield c
    await c.close()


def _elector(client: EtcdClient, role: FakeRole, group: str, broker_id: int,
             lease_s: float = LEASE_S, check: CheckQuorum | None = None) -> Elector:
    """An elector of ``group`` at ``http://127.0.0.1:2000<broker_id>`` (``check``: with the
    step-aside rule, as test_step_aside_election.py runs them)."""
    return Elector(client, role, cluster="test", broker_name=group, broker_id=broker_id,
                   address=f"http://127.0.0.1:{20000 + broker_id}", lease_s=lease_s,
                   margin_s=MARGIN_S, interval_s=INTERVAL_S, fence=role.fence, check=check)


async def _stop_all(electors: list[Elector]) -> None:
    for e in electors:
        await e.stop()


def _started(client: EtcdClient, roles: list[FakeRole], group: str,
             lease_s: float = LEASE_S) -> list[Elector]:
    """One running elector per role, broker ids in list order."""
    electors = [_elector(client, r, group, i, lease_s) for i, r in enumerate(roles)]
    for e in electors:
        e.start()
    return electors


async def _crash(elector: Elector) -> None:
    """Stop an elector's loops without giving its lease back (a SIGKILL or SIGSTOP)."""
    await elector._steps.stop()
    await cancel_tasks(elector._watch)


def test_best_member_prefers_offset_then_lower_id() -> None:
    members = [Claim(2, "c", 0, 10), Claim(1, "b", 0, 30), Claim(0, "a", 0, 30)]
    assert best_member(members) == Claim(0, "a", 0, 30)
    assert best_member([Claim(3, "d", 0, 5), Claim(0, "a", 0, 4)]) == Claim(3, "d", 0, 5)
    assert best_member([]) is None


async def test_first_leader_is_broker_0_and_the_other_follows(client: EtcdClient) -> None:
    group = f"g-{uuid.uuid4().hex[:6]}"
    roles = [FakeRole(), FakeRole()]
    electors = _started(client, roles, group)
    try:
        await wait_until_async(lambda: bool(roles[0].promoted) and bool(roles[1].demoted))
        assert roles[0].promoted[0][0] == 1
        assert roles[0].fence() and not roles[1].fence()
        assert roles[1].demoted[-1] == ("http://127.0.0.1:20000", 1)
        assert roles[1].promoted == []
        stored = await client.get(GroupKeys("test", group).epoch)
        assert stored is not None and stored.value == b"1"
    finally:
        await _stop_all(electors)


async def test_the_larger_offset_wins(client: EtcdClient) -> None:
    group = f"g-{uuid.uuid4().hex[:6]}"
    roles = [FakeRole(offset=100), FakeRole(offset=700), FakeRole(offset=300)]
    electors = _started(client, roles, group)
    try:
        await wait_until_async(lambda: bool(roles[1].promoted)
                               and all(r.demoted for i, r in enumerate(roles) if i != 1))
        assert roles[0].promoted == [] and roles[2].promoted == []
        assert roles[0].demoted[-1] == ("http://127.0.0.1:20001", 1)
    finally:
        await _stop_all(electors)


async def test_lease_lapse_elects_a_successor_under_the_next_epoch_and_fences_the_old(
        client: EtcdClient) -> None:
    group = f"g-{uuid.uuid4().hex[:6]}"
    old_role, new_role = FakeRole(offset=50), FakeRole(offset=40)
    old, new = _elector(client, old_role, group, 0), _elector(client, new_role, group, 1)
    old.start()
    await wait_until_async(lambda: bool(old_role.promoted))
    new.start()
    try:
        await wait_until_async(lambda: bool(new_role.demoted))
        await wait_until_async(old_role.fence)
        paused_at = time.monotonic()
        await _crash(old)  # no more renewals: as if SIGSTOPped
        # the fence shuts at a deadline its last renewal set, sent before the pause: by the
        # lease minus the margin after the pause at the latest, however late this loop runs
        assert old_role.fence.deadline <= paused_at + LEASE_S - MARGIN_S
        await wait_until_async(lambda: not old_role.fence())
        await wait_until_async(lambda: bool(new_role.promoted))
        epoch, elected_at = new_role.promoted[0]
        assert epoch == 2
        # never two brokers with an open fence: the old one had shut before the new promotion
        assert old_role.fence.deadline < elected_at
        # the old primary resumes: its lease is gone, it follows the new primary
        old.start()
        await wait_until_async(lambda: bool(old_role.demoted))
        assert old_role.demoted[-1] == ("http://127.0.0.1:20001", 2)
        assert not old_role.fence() and new_role.fence()
        assert len(old_role.promoted) == 1
    finally:
        await old.stop()
        await new.stop()


async def test_a_clean_stop_hands_over_at_once(client: EtcdClient) -> None:
    group = f"g-{uuid.uuid4().hex[:6]}"
    roles = [FakeRole(), FakeRole()]
    electors = _started(client, roles, group, LONG_LEASE_S)
    try:
        await wait_until_async(lambda: bool(roles[0].promoted) and bool(roles[1].demoted))
        await electors[0].stop()
        assert not roles[0].fence()
        # within a wait shorter than the lease: the stop gave the lease back
        await wait_until_async(lambda: bool(roles[1].promoted))
        assert roles[1].promoted[0][0] == 2
    finally:
        await electors[1].stop()


async def test_a_restarted_primary_ends_its_earlier_lease(client: EtcdClient) -> None:
    """A primary restarted within its lease revokes its own stale claim and is elected again
    (alone in its group) without waiting for the old lease to lapse."""
    group = f"g-{uuid.uuid4().hex[:6]}"
    first_role = FakeRole()
    first = _elector(client, first_role, group, 0, LONG_LEASE_S)
    first.start()
    await wait_until_async(lambda: bool(first_role.promoted))
    await _crash(first)
    again_role = FakeRole()
    again = _elector(client, again_role, group, 0, LONG_LEASE_S)
    again.start()
    try:
        # within a wait shorter than the earlier lease: it was revoked, it did not lapse
        await wait_until_async(lambda: bool(again_role.promoted))
        assert again_role.promoted[0][0] == 2
        kv = await client.get(GroupKeys("test", group).primary)
        assert isinstance(kv, KeyValue) and kv.lease == again.lease
    finally:
        await again.stop()
        first.lease = 0


async def test_fence_is_false_without_etcd(tmp_path: Path) -> None:
    """An unreachable etcd never opens the fence."""
    timeout_s = 0.2
    c = EtcdClient(["http://127.0.0.1:9"], timeout_s=timeout_s)
    role = FakeRole()
    e = _elector(c, role, "nowhere", 0)
    e.start()
    try:
        # shut through three of its etcd timeouts (0.2 s each)
        assert await quiet_for_async(lambda: (role.fence(), list(role.promoted)),
                                     3 * timeout_s, "the fence") == (False, [])
    finally:
        await e.stop()
        await c.close()


async def test_a_new_epoch_is_past_the_one_the_broker_recorded(client: EtcdClient) -> None:
    """etcd's counter may be behind the broker's own epoch history (a fresh etcd): the new
    epoch is past both."""
    group = f"g-{uuid.uuid4().hex[:6]}"
    role = FakeRole()
    role.epoch = 7
    e = _elector(client, role, group, 0)
    e.start()
    try:
        await wait_until_async(lambda: bool(role.promoted))
        assert role.promoted[0][0] == 8
        stored = await client.get(GroupKeys("test", group).epoch)
        assert stored is not None and stored.value == b"8"
    finally:
        await e.stop()


class SlowRole(FakeRole):
    """A promotion that takes longer than the lease (a large log to rebuild from)."""

    async def promote(self, epoch: int) -> None:
        await asyncio.sleep(LEASE_S * 1.5)
        await super().promote(epoch)


async def test_a_slow_promotion_keeps_its_lease(client: EtcdClient) -> None:
    group = f"g-{uuid.uuid4().hex[:6]}"
    slow, other = SlowRole(offset=10), FakeRole(offset=0)
    first, second = _elector(client, slow, group, 0), _elector(client, other, group, 1)
    first.start()
    second.start()
    try:
        await wait_until_async(lambda: bool(slow.promoted))
        # a lease lost during the promotion lapses within one lease: the other never promotes
        assert await quiet_for_async(lambda: list(other.promoted), LEASE_S, "promotions") == []
        assert other.demoted[-1] == ("http://127.0.0.1:20000", 1)
        kv = await client.get(GroupKeys("test", group).primary)
        assert isinstance(kv, KeyValue) and kv.lease == first.lease  # the same lease still
        await wait_until_async(slow.fence)  # and it may write (a renewal may be just late)
    finally:
        await first.stop()
        await second.stop()


# A step interval (and settle) no wait below outlasts (s): a successor elected within such a wait
# campaigned on the watch event and did not wait out a fixed settle (issue 32).
SLOW_STEP_S = 3 * TIMEOUT_S


def _slow_stepper(client: EtcdClient, role: FakeRole, group: str, broker_id: int) -> Elector:
    """An elector whose own steps come only every ``SLOW_STEP_S`` (its lease outlasts them):
    whatever it does sooner, a watch event made it do."""
    return Elector(client, role, cluster="test", broker_name=group, broker_id=broker_id,
                   address=f"http://127.0.0.1:{20000 + broker_id}", lease_s=2 * SLOW_STEP_S,
                   margin_s=MARGIN_S, interval_s=SLOW_STEP_S, fence=role.fence)


async def test_a_clean_stop_elects_the_successor_on_the_watch_event(client: EtcdClient) -> None:
    """The revoke wakes the successor at once, and its campaign waits only until the live
    members have published since the primary vanished, not a fixed settle."""
    group = f"g-{uuid.uuid4().hex[:6]}"
    roles = [FakeRole(offset=10), FakeRole(offset=10)]
    leader = Elector(client, roles[0], cluster="test", broker_name=group, broker_id=0,
                     address="http://127.0.0.1:20000", lease_s=LONG_LEASE_S, margin_s=MARGIN_S,
                     interval_s=INTERVAL_S, settle_s=0.0, fence=roles[0].fence)
    leader.start()
    successor = _slow_stepper(client, roles[1], group, 1)
    try:
        await wait_until_async(lambda: bool(roles[0].promoted))
        successor.start()
        await wait_until_async(lambda: bool(roles[1].demoted))
        stopped = leader.resign()
        assert not roles[0].fence()  # at once, before the revoke is even sent
        await stopped
        await wait_until_async(lambda: bool(roles[1].promoted), timeout=SLOW_STEP_S / 2,
                               what="the successor elected well before its next step")
        assert roles[1].promoted[0][0] == 2
        # the fence opens once the promotion returns (Elector._campaign: promote, then lead)
        await wait_until_async(roles[1].fence, what="the successor's fence open")
    finally:
        await leader.stop()
        await successor.stop()


async def test_a_lapsed_lease_elects_the_successor_on_the_watch_event(
        client: EtcdClient) -> None:
    group = f"g-{uuid.uuid4().hex[:6]}"
    roles = [FakeRole(offset=10), FakeRole(offset=10)]
    leader = Elector(client, roles[0], cluster="test", broker_name=group, broker_id=0,
                     address="http://127.0.0.1:20000", lease_s=LEASE_S, margin_s=MARGIN_S,
                     interval_s=INTERVAL_S, settle_s=0.0, fence=roles[0].fence)
    leader.start()
    successor = _slow_stepper(client, roles[1], group, 1)
    try:
        await wait_until_async(lambda: bool(roles[0].promoted))
        successor.start()
        await wait_until_async(lambda: bool(roles[1].demoted))
        await _crash(leader)  # no revoke: the lease lapses in etcd
        await wait_until_async(lambda: bool(roles[1].promoted), timeout=SLOW_STEP_S / 2,
                               what="the successor elected when the lease lapsed")
        assert roles[1].promoted[0][0] == 2
    finally:
        await leader.stop()
        await successor.stop()


async def test_a_member_copying_back_cut_records_does_not_run(client: EtcdClient) -> None:
    """The most caught-up member that still copies back damaged records it cut
    (replication/recopy.py) does not lead, and nobody else does in its place; it runs once its
    log is whole again."""
    group = f"g-{uuid.uuid4().hex[:6]}"
    role = FakeRole(offset=10)
    role.leads = False
    e = _elector(client, role, group, 0)
    e.start()
    try:
        # three election steps (INTERVAL_S each) without a promotion
        assert await quiet_for_async(lambda: list(role.promoted), 3 * INTERVAL_S,
                                     "promotions") == []
        role.leads = True
        await wait_until_async(lambda: bool(role.promoted), what="elected once whole")
    finally:
        await e.stop()
