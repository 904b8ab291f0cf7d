"""Who leads a broker group: decided by etcd (a lease and an epoch counter), never by us.

Keys, under ``/tidemq/<cluster>/<broker_name>/`` (``GroupKeys``):

- ``primary``: ``{"broker_id", "address", "epoch"}`` of the group's primary, bound to the
  primary's lease: it disappears by itself ``lease_s`` after the primary stops renewing;
- ``epoch``: the last epoch any primary of the group was elected under (a decimal number),
  bumped by the same transaction that writes ``primary``;
- ``members/<broker_id>``: ``{"broker_id", "address", "last_offset", "epoch"}`` of every live
  member, bound to that member's own lease and rewritten at every step; a member standing aside
  adds ``"aside": true`` and ``"acked"`` (its high-water mark when it stepped aside).

Each broker runs an ``Elector``. Every ``interval_s`` (and at once when a key of the group
changes, through a watch) it renews its lease, publishes its ``last_offset()`` and reads
``primary``:

- the primary is another broker: follow it (``role.demote(address, epoch)``) if not already;
- there is none: publish the offset again, wait until every live member has published its
  offset since the primary key vanished (the watch saw the deletion at a revision; a member
  publishes at once when it sees it too), at most ``settle_s``, and campaign only if no live
  member has a larger one (ties: the lower ``broker_id``; members standing aside are skipped,
  and nobody runs whose offset is below one's ``acked``). Offsets published after the
  vanishing are final for what was acknowledged: the old primary acknowledged nothing past
  its fence, which shut before its lease could go. The campaign is one transaction:
  ``primary`` absent and ``epoch`` unchanged since read → write both (the new epoch is one
  past the larger of the stored one and ours). The winner promotes itself
  (``role.promote(epoch)``) and re-registers with the nameservers at once.

Fencing: the ``LeaseFence`` the composition root hands both to the elector and to the broker's
role (its ``fence``) is open only while this broker leads and its lease is surely alive in etcd:
until the time the last successful renewal was *sent* + the lease TTL - ``margin_s``, on the
monotonic clock; only the elector moves it. etcd cannot expire the lease (and elect a successor)
before that, so a primary paused past its lease (SIGSTOP) finds its fence shut when it resumes,
before it can acknowledge anything; its next renewal finds the lease gone, and it follows the
new primary. A clean stop (``resign``, which the broker calls on SIGTERM before it drains its
requests) shuts the fence and revokes the lease, so the successor is elected at once: the
deletion wakes every member through the watch, not at its next step.

Stepping aside (CheckQuorum, replication/aside.py): a primary whose replicas have all stopped
fetching from it for longer than ``step_aside_after_s`` while etcd shows a quorum of them alive
(their claims rewritten since, under its epoch) gives the lead up, as ``resign`` does: fence
first, then its claim rewritten under a fresh lease with ``aside``, then the old lease revoked.
It does not run for the hold (``step_aside_hold_leases`` leases, or until it follows the new
primary), so the replicas elect the best of them instead of waiting for the most caught-up
member. Dead or paused replicas (claims gone, or not rewritten) never make it step aside: a
primary alone keeps its lease and refuses writes with NOT_ENOUGH_REPLICAS.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from tidemq_server.broker.replication.aside import CheckQuorum, QuorumView
from tidemq_server.broker.replication.claims import (
    Claim,
    GroupKeys,
    LeaseFence,
    best_member,
)
from tidemq_server.broker.settings import BrokerSettings
from tidemq_server.common.etcd import (
    EtcdClient,
    EtcdError,
    LeaseLost,
    WatchEvent,
    absent,
    mod_revision_is,
    put,
)
from tidemq_server.common.loop import BackgroundLoop, cancel_tasks

log = logging.getLogger(__name__)

SETTLE_POLL_S = 0.02  # a campaign re-reads the members this often while they settle (s)


class RoleSeam(Protocol):
    """What the election drives: the broker's replication role (replication/role.py)."""

    epoch: int  # the epoch this broker last led or followed under

    async def promote(self, epoch: int) -> None: ...

    async def demote(self, primary_address: str, epoch: int) -> None: ...

    def last_offset(self) -> int: ...

    def may_lead(self) -> bool: ...


def elected(settings: BrokerSettings) -> bool:
    """Whether etcd decides who leads this broker's group (else the role is static)."""
    return bool(settings.etcd_urls) and settings.replicated


def elector_for(settings: BrokerSettings, role: RoleSeam, fence: LeaseFence,
                quorum: QuorumView | None = None) -> Elector:
    """The broker's elector (its group replicates and ``etcd_endpoints`` is set), moving
    ``fence``, which the role asks before every acknowledgement; with ``quorum`` (the primary's
    view of its replicas) it steps aside when cut off from them (replication/aside.py)."""
    s = settings
    check = (CheckQuorum(quorum, s.quorum, s.step_aside_after_s,
                         s.step_aside_hold_leases * s.lease_s) if quorum is not None else None)
    return Elector(EtcdClient(s.etcd_urls), role, cluster=s.cluster, broker_name=s.broker_name,
                   broker_id=s.broker_id, address=s.internal_url, lease_s=s.lease_s,
                   margin_s=s.lease_margin_s, interval_s=s.election_interval_s, fence=fence,
                   check=check)


class _Steps(BackgroundLoop):
    """The elector's steps: every ``interval_s``, at once on ``wakeup`` (a key of the group
    changed, a campaign lost a race). ``stop`` ends them even when its cancel meets a wakeup
    (3.11's ``wait_for`` may swallow that cancel: the loop checks its stop flag)."""

    name = "election"

    def __init__(self, elector: Elector) -> None:
        super().__init__(elector.interval_s)
        self.elector = elector

    async def run_once(self) -> None:
        await self.elector.logged_step()


class Elector:
    """Campaigns for one broker in its group and drives its role; see the module docstring."""

    def __init__(self, client: EtcdClient, role: RoleSeam, *, cluster: str, broker_name: str,
                 broker_id: int, address: str, lease_s: float, margin_s: float,
                 interval_s: float, settle_s: float | None = None,
                 on_change: Callable[[bool, int], Awaitable[None]] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 fence: LeaseFence | None = None, check: CheckQuorum | None = None) -> None:
        if margin_s >= lease_s:
            raise ValueError(f"lease margin {margin_s}s must be shorter than the lease {lease_s}s")
        self.client = client
        self.role = role
        self.keys = GroupKeys(cluster, broker_name)
        self.broker_id = broker_id
        self.address = address
        self.lease_ttl = max(1, round(lease_s))  # etcd leases are whole seconds
        self.margin_s = margin_s
        self.interval_s = interval_s
        self.settle_s = interval_s if settle_s is None else settle_s
        self.on_change = on_change
        self.clock = clock
        self.lease = 0  # our etcd lease id (0: none yet, or lost)
        self.write_fence = fence if fence is not None else LeaseFence(clock)
        self.epoch = 0  # the epoch we lead or follow under
        self.following: Claim | None = None
        self.elections = 0  # campaigns won (a metric)
        self._steps = _Steps(self)
        self._watch: asyncio.Task[None] | None = None
        self._error = ""
        self._refused: Claim | None = None  # a primary claim older than our epoch (logged once)
        # etcd revision at which the watch saw the primary key deleted (0: none seen since a
        # primary was last read): members that published after it have settled
        self.vanished = 0
        self._resigning: asyncio.Task[None] | None = None
        self.check = check  # CheckQuorum: step aside when cut off (None: never)

    # --- the fence ----------------------------------------------------------------------------

    def fence(self) -> bool:
        """May this broker acknowledge a write now? (leads, and its lease is surely alive)"""
        return self.write_fence()

    @property
    def leading(self) -> bool:
        return self.write_fence.leading

    @property
    def deadline(self) -> float:
        return self.write_fence.deadline

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        log.info("election for %s/%d through etcd %s (lease %d s)", self.keys.broker_name,
                 self.broker_id, ", ".join(self.client.endpoints), self.lease_ttl)
        self._resigning = None
        self._steps.start()
        self._watch = asyncio.create_task(self._watch_group(), name="election-watch")

    def resign(self) -> asyncio.Task[None]:
        """Stop campaigning now, in the background (a broker told to stop, before it drains
        its requests); ``stop`` awaits the same task."""
        if self._resigning is None:
            was_leading = self.leading
            self.write_fence.lose()  # before anything else: nothing is acknowledged from here
            self._resigning = asyncio.create_task(self._stop(was_leading),
                                                  name="election-resign")
        return self._resigning

    async def stop(self) -> None:
        """Stop campaigning; a leader gives its lease back so a successor is elected at once."""
        await self.resign()

    async def _stop(self, was_leading: bool) -> None:
        await self._steps.stop()
        await cancel_tasks(self._watch)
        self._watch = None
        self.write_fence.lose()  # a step that was running may have led again meanwhile
        if self.lease:
            with contextlib.suppress(EtcdError):
                await self.client.revoke(self.lease)
            if was_leading:
                log.info("gave up the lead of %s (epoch %d)", self.keys.broker_name, self.epoch)
        self.lease = 0

    async def close(self) -> None:
        await self.stop()
        await self.client.close()

    async def logged_step(self) -> None:
        """``step``, its failure logged (an etcd error once, until it changes)."""
        try:
            await self.step()
            if self._error:
                log.info("etcd answers again")
                self._error = ""
        except EtcdError as exc:
            if str(exc) != self._error:
                log.warning("election step failed (%s)%s", exc,
                            "; writes stop once the lease deadline passes"
                            if self.leading else "")
            self._error = str(exc)
        except Exception:
            log.exception("election step failed")

    async def _watch_group(self) -> None:
        """Wake the steps whenever a key of the group changes (the primary's lease lapsing)."""
        while True:
            try:
                async for events in self.client.watch_prefix(self.keys.primary):
                    self._saw(events)
                    self._steps.wakeup()
            except EtcdError as exc:
                log.debug("watch ended: %s", exc)
            await asyncio.sleep(self.interval_s)

    def _saw(self, events: list[WatchEvent]) -> None:
        gone = [e.revision for e in events if e.kind == "DELETE" and e.key == self.keys.primary]
        if gone:
            self.vanished = max(self.vanished, *gone)

    # --- one step -----------------------------------------------------------------------------

    async def step(self) -> None:
        """Renew, publish, then lead, follow or campaign (see the module docstring)."""
        await self._renew()
        revision = await self._publish()
        kv = await self.client.get(self.keys.primary)
        claim = Claim.decode(kv) if kv is not None else None
        if kv is not None and claim is not None:
            if kv.mod_revision > self.vanished:  # not a read from before the vanishing
                self.vanished = 0  # a primary again: the next vanishing is a new one
            if kv.lease == self.lease and claim.broker_id == self.broker_id:
                if self.leading:  # we lead, lease renewed above
                    await self._check_quorum(revision)
                elif self.check is not None and self.check.holding:
                    await self._hand_back()  # stepping aside met an etcd error: again
                return
            if claim.broker_id == self.broker_id:
                # our own claim under another lease: from an earlier life of this broker
                # (restarted within the lease), or left by stepping aside (its revoke failed);
                # end that lease so the group elects at once
                log.warning("a primary claim of this broker under an earlier lease (%x, %s): "
                            "revoking it", kv.lease, "stepping aside" if self.check is not None
                            and self.check.holding else "from an earlier process")
                await self.client.revoke(kv.lease)
                return
            await self._follow(claim)
            return
        if self.leading:
            self._lost("our primary key is gone")
        await self._campaign()

    async def _renew(self) -> None:
        sent = self.clock()
        if self.lease:
            try:
                ttl = await self.client.keepalive(self.lease)
            except LeaseLost:
                self.lease = 0
                self._lost("the lease expired in etcd")
            else:
                self.write_fence.hold_until(sent + ttl - self.margin_s)
                return
        self.lease = await self.client.grant(self.lease_ttl)
        self.write_fence.hold_until(sent + self.lease_ttl - self.margin_s)

    async def _renewing(self, change: Awaitable[None]) -> None:
        """Run a role change (a promotion rebuilds state from the log and may take a while)
        while the lease keeps being renewed, so it cannot lapse meanwhile."""
        async def renew() -> None:
            while True:
                await asyncio.sleep(self.interval_s)
                try:
                    await self._renew()
                except EtcdError as exc:
                    log.warning("lease renewal during a role change failed: %s", exc)

        task = asyncio.create_task(renew(), name="election-renew")
        try:
            await change
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _lost(self, why: str) -> None:
        if self.leading:
            log.warning("lost the lead of %s (epoch %d): %s; writes are refused",
                        self.keys.broker_name, self.epoch, why)
        self.write_fence.lose()
        if self.check is not None:
            self.check.reset()

    async def _publish(self) -> int:
        """Rewrite our member claim; the etcd revision of that write."""
        aside = self.check is not None and self.check.holding
        me = Claim(self.broker_id, self.address, self.epoch, self.role.last_offset(), aside,
                   self.check.acked if self.check is not None and aside else 0)
        return await self.client.put(self.keys.member(self.broker_id), me.encode(), self.lease)

    # --- stepping aside (replication/aside.py) --------------------------------------------------
    async def _check_quorum(self, revision: int) -> None:
        """While leading: step aside once our replicas have stopped fetching for longer than
        the threshold while etcd shows a quorum of them alive."""
        check = self.check
        if check is None or not check.observe(revision):
            return
        kvs = await self.client.get_prefix(self.keys.members)
        members = [(kv.mod_revision, c) for kv in kvs if (c := Claim.decode(kv)) is not None]
        why = check.verdict(members, self.broker_id, self.epoch)
        if why is None:
            return
        self.write_fence.lose()  # first: nothing is acknowledged from here
        check.stand_aside()
        log.warning("stepping aside as primary of %s (epoch %d): %s; writes are refused, the "
                    "lead is given up and this member does not run for %.1f s or until it "
                    "follows a new primary, which must hold offset %d", self.keys.broker_name,
                    self.epoch, why, check.hold_s, check.acked)
        await self._hand_back()

    async def _hand_back(self) -> None:
        """Give the lead up while standing aside, our member claim never absent: rewrite it
        (``aside``) under a fresh lease, then revoke the old one, ``primary`` with it."""
        old = self.lease
        self.lease = await self.client.grant(self.lease_ttl)
        await self._publish()
        await self.client.revoke(old)
        log.info("gave up the lead of %s (epoch %d)", self.keys.broker_name, self.epoch)

    async def _follow(self, primary: Claim) -> None:
        if not self.leading and self.following == primary:
            return
        if self.leading:
            self._lost(f"broker {primary.broker_id} leads under epoch {primary.epoch}")
        log.info("following %s/%d at %s (epoch %d)", self.keys.broker_name, primary.broker_id,
                 primary.address, primary.epoch)
        self.epoch = max(self.epoch, primary.epoch)
        if primary.epoch < self.role.epoch:
            if self._refused != primary:
                log.error("etcd names %s (epoch %d) primary, but this broker knows epoch %d: "
                          "not following it", primary.address, primary.epoch, self.role.epoch)
            self._refused = primary
            return
        await self._renewing(self.role.demote(primary.address, primary.epoch))
        self.following = primary
        if self.check is not None:
            self.check.release()  # a new primary leads: the hold has done its work
        if self.on_change is not None:
            await self.on_change(False, primary.epoch)

    async def members(self) -> list[Claim]:
        found = [Claim.decode(kv) for kv in await self.client.get_prefix(self.keys.members)]
        return [c for c in found if c is not None]

    async def _settled(self) -> list[Claim]:
        """The members, once each has published since the primary vanished (every live member
        wakes on that deletion and publishes at once), or ``settle_s`` after asking when that
        vanishing was not seen or a member stays silent."""
        deadline = self.clock() + self.settle_s
        while True:
            kvs = await self.client.get_prefix(self.keys.members)
            settled = self.vanished > 0 and all(kv.mod_revision > self.vanished for kv in kvs)
            if settled or self.clock() >= deadline:
                found = [Claim.decode(kv) for kv in kvs]
                return [c for c in found if c is not None]
            await asyncio.sleep(min(SETTLE_POLL_S, max(0.0, deadline - self.clock())))

    async def _campaign(self) -> None:
        """No primary: let every member publish its final offset, then the best one runs."""
        await self._publish()
        if self.check is not None and self.check.holding:
            return  # standing aside: the others elect one of them
        members = await self._settled()
        best = best_member(members)
        if best is None and any(m.aside for m in members):
            log.info("no primary in %s: no member that may run holds what the member standing "
                     "aside acknowledged; waiting", self.keys.broker_name)
            return
        if best is not None and best.broker_id == self.broker_id and not self.role.may_lead():
            log.warning("no primary in %s: this member cut damaged records from its log and "
                        "has not copied them back yet: not running", self.keys.broker_name)
            return
        if best is None or best.broker_id != self.broker_id:
            if best is not None:
                log.info("no primary in %s: member %d (offset %d) is the most caught up, "
                         "waiting for it", self.keys.broker_name, best.broker_id,
                         best.last_offset)
            return
        stored = await self.client.get(self.keys.epoch)
        revision = stored.mod_revision if stored is not None else 0
        try:
            current = int(stored.value) if stored is not None else 0
        except ValueError:
            current = 0
        epoch = max(current, self.epoch, self.role.epoch) + 1
        sent = self.clock()
        me = Claim(self.broker_id, self.address, epoch, self.role.last_offset())
        won = await self.client.txn(
            [absent(self.keys.primary), mod_revision_is(self.keys.epoch, revision)],
            [put(self.keys.primary, me.encode(), self.lease),
             put(self.keys.epoch, str(epoch).encode())])
        if not won:
            log.info("campaign in %s lost a race; reading the new state", self.keys.broker_name)
            self._steps.wakeup()
            return
        self.write_fence.hold_until(min(self.deadline, sent + self.lease_ttl - self.margin_s))
        log.warning("elected primary of %s under epoch %d (offset %d)", self.keys.broker_name,
                    epoch, me.last_offset)
        self.epoch = epoch
        self.following = None
        if self.check is not None:
            self.check.reset()  # a new term: its cut is measured from its own steps
        await self._renewing(self.role.promote(epoch))
        self.write_fence.lead()
        self.elections += 1
        if self.on_change is not None:
            await self.on_change(True, epoch)
