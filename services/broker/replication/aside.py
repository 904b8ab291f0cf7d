"""CheckQuorum: a primary cut off from replicas that etcd shows alive steps aside.

Raft's CheckQuorum has a leader step down once it has not heard from a quorum for an election
timeout. Here the primary hears its replicas through their fetches (its ``Quorum``) and etcd
tells who is alive: each member's ``members/<id>`` claim is bound to that member's lease and
rewritten at each of its election steps. Without the rule a partition that cuts the primary
from its replicas but not from etcd (a *bridge*) leaves the group unwritable for as long as it
lasts: the primary keeps its lease and answers NOT_ENOUGH_REPLICAS, although its replicas hold
a quorum of copies of every acknowledged record and etcd could elect one of them.

The rule, at each step of the leading elector (``CheckQuorum.observe`` then ``verdict``):

- its replicas are *cut off* (``Quorum.cut_off``: under sync replication too few copies fetch
  at all to make the quorum), continuously for longer than ``after_s``;
- and etcd shows at least ``quorum`` *other* members that could be elected without it: claims
  rewritten since the cut began (running, and reaching etcd now: a paused member's claim lingers
  until its lease lapses but is not rewritten), under its own epoch or a later one (they know it
  leads, so their silence is not a start-up's), and not standing aside themselves.

Replicas that are dead or paused never count: a primary alone keeps its lease and refuses writes
as before, since no election could do better. When the rule holds, the elector steps aside: its
write fence shuts first (nothing is acknowledged from here), its member claim is rewritten under
a fresh lease saying ``aside`` with ``acked`` = its high-water mark, then the old lease is
revoked (the ``primary`` key goes with it). The hold lasts ``hold_s`` or until it follows a new
primary: meanwhile it does not run, and every campaign skips it (``election.best_member``) and
elects nobody whose offset is below ``acked`` (every acknowledged record is below the HWM, held
by a quorum of copies: the best replica holds it). Its own unacknowledged tail is cut when it
follows (the epoch histories diverge there). Once the hold is over it may run again: when no
replica could be elected, it is the only candidate again, which loses nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Protocol


class QuorumView(Protocol):
    """What the rule reads of the primary's view of its replicas (replication/quorum.py)."""

    hwm: int  # every byte below is held by a quorum of copies

    def cut_off(self) -> bool: ...


class Member(Protocol):
    """What the rule reads of a ``members/<id>`` claim (election.Claim)."""

    @property
    def broker_id(self) -> int: ...

    @property
    def epoch(self) -> int: ...

    @property
    def aside(self) -> bool: ...


class CheckQuorum:
    """The step-aside decision and the hold of one elector (see the module docstring)."""

    def __init__(self, view: QuorumView, quorum: int, after_s: float, hold_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.view = view
        self.quorum = quorum  # copies that make a record safe, the primary included
        self.after_s = after_s
        self.hold_s = hold_s
        self.clock = clock
        self.cut_since: float | None = None  # clock() when the cut began (None: not cut off)
        self.baseline = 0  # etcd revision of our claim's rewrite at the step the cut began
        self.held_until = 0.0  # clock() until which this member stands aside
        self.acked = 0  # the HWM when it stepped aside: a successor must hold every byte below

    # --- while leading ------------------------------------------------------------------------
    def observe(self, revision: int) -> bool:
        """At a step while leading (``revision``: of that step's rewrite of our claim): True once
        the replicas have been cut off continuously for longer than ``after_s``."""
        if not self.view.cut_off():
            self.cut_since = None
            return False
        now = self.clock()
        if self.cut_since is None:
            self.cut_since, self.baseline = now, revision
        return now - self.cut_since > self.after_s

    def cut_for(self) -> float:
        """How long the replicas have been cut off (s; 0 when they are not)."""
        return 0.0 if self.cut_since is None else self.clock() - self.cut_since

    def electable(self, members: Iterable[tuple[int, Member]], me: int,
                  epoch: int) -> list[int]:
        """Broker ids of the other members that could be elected in our place, from
        ``(mod_revision, claim)`` of every member key: rewritten since the cut began, under
        ``epoch`` or later, not standing aside."""
        return sorted(c.broker_id for rev, c in members
                      if c.broker_id != me and rev > self.baseline and c.epoch >= epoch
                      and not c.aside)

    def verdict(self, members: Iterable[tuple[int, Member]], me: int,
                epoch: int) -> str | None:
        """Why to step aside now (for the log), None to keep the lead. Only after ``observe``
        answered True."""
        others = self.electable(members, me, epoch)
        if len(others) < self.quorum:
            return None
        return (f"no replica has fetched for {self.cut_for():.1f} s while etcd shows members "
                f"{', '.join(map(str, others))} alive, a quorum of {self.quorum} without this "
                "one")

    def reset(self) -> None:
        """A new term, or the lead lost: the cut is measured again from the next step."""
        self.cut_since = None

    # --- the hold -----------------------------------------------------------------------------
    def stand_aside(self) -> None:
        """Begin the hold, keeping the HWM a successor must reach."""
        self.held_until = self.clock() + self.hold_s
        self.acked = self.view.hwm
        self.cut_since = None

    @property
    def holding(self) -> bool:
        return self.clock() < self.held_until

    def release(self) -> None:
        """End the hold early: this member follows a new primary."""
        self.held_until = 0.0
