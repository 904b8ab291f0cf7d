"""The checker's judgements of time: timers against the broker's clock and contract, committed
offsets read back (backwards or forwards), and each fault's unavailability window. Pure, like
bench/_faults/checker.py, which calls them and documents each violation."""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from typing import TYPE_CHECKING

from bench._faults.history import FAIL, OK, History, Op

if TYPE_CHECKING:
    from bench._faults.checker import Result

LATE_P99_LIMIT_MS = 5_000  # timers due outside fault windows: p99 of lateness at most this
RECOVERY_MS = 20_000  # a fault's effects are looked for until this long after its heal
ALREADY_DELIVERED = "ALREADY_DELIVERED"  # the cancel's 409 code


def due_of(op: Op) -> int:
    """The due time by the contract: what the broker's answer gave (never before what was
    asked: ``due_ms`` is the client's clock at the send plus the delay, the earliest the broker
    can have received it)."""
    return max(op.deliver_at_ms, op.due_ms)


def _in_fault(h: History, t_ms: int, family: str | None = None,
              unwritable: bool = False) -> bool:
    return any(f.start_ms <= t_ms <= (f.heal_ms or h.end_ms) + RECOVERY_MS
               and (family is None or f.family == family)
               and not (unwritable and f.writable) for f in h.faults)


def check_timers(h: History, r: Result, reads: list[Op], cancelled: set[str],
                 sent: dict[str, Op]) -> None:
    # each delivered timer's first copy: (store time by the broker's clock, read time)
    first: dict[str, tuple[int, int]] = {}
    for op in reads:
        stamp = op.store_ms or op.complete_ms
        if op.id not in first or stamp < first[op.id][0]:
            first[op.id] = (stamp, op.complete_ms)
    for s in h.final:
        if s.store_ms and (s.id not in first or s.store_ms < first[s.id][0]):
            first[s.id] = (s.store_ms, h.end_ms)
    for mid, (stored, read) in sorted(first.items()):
        found = sent.get(mid)
        if found is None or found.f != "delay":
            continue
        due = due_of(found)
        # a host whose wall clock a nemesis moved stamps wrong store times: while a clock
        # fault lasts, the consumer's clock (never moved) judges instead
        at = read if _in_fault(h, read, "clock") or _in_fault(h, stored, "clock") else stored
        if at < due:
            r.flag("early_timers", f"timer {mid} delivered at {at}, {due - at} ms before due")
        else:
            r.late_ms.append(at - due)
            if not _in_fault(h, due):
                r.late_calm_ms.append(at - due)
            if not _in_fault(h, due, unwritable=True):
                r.late_writable_ms.append(at - due)
        if mid in cancelled:
            r.flag("after_cancel", f"timer {mid} delivered at {at} although cancelled")
    for op in h.by_kind("cancel"):
        found = sent.get(op.id)
        if (op.type == FAIL and ALREADY_DELIVERED in op.error and found is not None
                and op.complete_ms < due_of(found) and not _in_fault(h, op.complete_ms, "clock")):
            r.flag("early_timers", f"timer {op.id}: cancel answered already delivered at "
                                   f"{op.complete_ms}, {due_of(found) - op.complete_ms} ms "
                                   "before due")
    if r.late(0.99, calm=True) > LATE_P99_LIMIT_MS:
        r.flag("late_timers", f"p99 lateness outside faults {r.late(0.99, calm=True)} ms > "
                              f"{LATE_P99_LIMIT_MS} ms ({len(r.late_calm_ms)} timers)")


def check_offsets(h: History, r: Result) -> None:
    acked: dict[tuple[str, str, str, int], list[tuple[int, int]]] = defaultdict(list)
    asked: dict[tuple[str, str, str, int], list[tuple[int, int]]] = defaultdict(list)
    for op in h.by_kind("commit_offset"):
        key = (op.cgroup, op.group, op.topic, op.queue)
        if op.type == OK:
            acked[key].append((op.complete_ms, op.offset))
        if op.type != FAIL:  # an unknown commit may have landed
            asked[key].append((op.invoke_ms, op.offset))
    for op in h.by_kind("fetch_offset"):
        if op.type != OK:
            continue
        key = (op.cgroup, op.group, op.topic, op.queue)
        name = f"{op.cgroup} {op.group}/{op.topic}/{op.queue}"
        before = [o for t, o in acked.get(key, []) if t < op.invoke_ms]
        if before and op.offset < max(before):
            r.flag("offsets_backwards", f"{name}: read back {op.offset} after {max(before)} "
                                        "was committed")
        most = max((o for t, o in asked.get(key, []) if t < op.complete_ms), default=0)
        if op.offset > most:
            r.flag("offsets_forward", f"{name}: read back {op.offset}, the group never "
                                      f"committed past {most}")


def check_unavailability(h: History, r: Result) -> None:
    """Per fault, the longest time a broker group acknowledged no send *while one was asked of
    it* (a send to it outstanding): the writers are few and sequential, so while they all wait
    on one group the other is asked nothing, and its silence then measures the workload, not
    the group. A gap is judged from the later of its start and the first moment a send to the
    group was outstanding in it, to the next acknowledgement. Each gap is the fault's in whose
    window it began: from the fault's start to the next fault's start (or ``RECOVERY_MS`` past
    its heal, if sooner), so one long gap is not charged to the faults before it as well.
    For a fault no side could write through (``Fault.writable`` False) it also keeps the part
    of the worst gap past the heal: the recovery, what tidemq answers for there."""
    acks: dict[str, list[int]] = defaultdict(list)
    asks: dict[str, list[tuple[int, int]]] = defaultdict(list)  # (invoke, complete) per group
    for op in h.by_kind("send"):
        if op.group:
            asks[op.group].append((op.invoke_ms, op.complete_ms))
            if op.type == OK:
                acks[op.group].append(op.complete_ms)
    asked = {g: Asked(spans) for g, spans in asks.items()}
    for times in acks.values():
        times.sort()
    # sends stop before the end (reads go on): no ack after the last send began means nothing
    last = max((op.invoke_ms for op in h.by_kind("send")), default=h.end_ms)
    for i, fault in enumerate(h.faults):
        nxt = h.faults[i + 1].start_ms if i + 1 < len(h.faults) else last
        until = min(fault.heal_ms + RECOVERY_MS, nxt, last) if fault.heal_ms else min(nxt, last)
        worst = recovery = 0
        for group, times in acks.items():
            # gaps between acks from the fault's start, up to the first ack past the window
            # (or the end of the run, when the group never acknowledged again)
            after = [t for t in times if t > fault.start_ms]
            inside = [t for t in after if t < until]
            later = after[len(inside):len(inside) + 1] or [max(until, fault.start_ms)]
            points = [fault.start_ms, *inside, *later]
            for a, b in itertools.pairwise(points):
                since = asked[group].first_outstanding(a, b)
                if since is not None and since < nxt:  # asked from the next fault on: its
                    worst = max(worst, b - since)
                    if fault.heal_ms:
                        recovery = max(recovery, b - max(since, fault.heal_ms))
        name = f"{i + 1}. {fault.name}"
        r.unavailable_s[name] = worst / 1000
        if not fault.writable:
            r.recovery_s[name] = recovery / 1000


class Asked:
    """When sends to one group were outstanding: ``first_outstanding(a, b)`` is the first
    moment in ``[a, b)`` at which one was (None: the group was asked nothing then)."""

    def __init__(self, spans: list[tuple[int, int]]) -> None:
        spans.sort()
        self.invokes = [s for s, _ in spans]
        self.reach: list[int] = []  # the latest completion among the spans begun so far
        most = -1
        for _, end in spans:
            most = max(most, end)
            self.reach.append(most)

    def first_outstanding(self, a: int, b: int) -> int | None:
        j = bisect.bisect_right(self.invokes, a) - 1
        if j >= 0 and self.reach[j] > a:
            return a  # one begun before ``a`` was still out at ``a``
        k = bisect.bisect_right(self.invokes, a)
        if k < len(self.invokes) and self.invokes[k] < b:
            return self.invokes[k]
        return None


def check_failovers(h: History, r: Result) -> None:
    """Per fault that brought a new primary (an epoch of a replicated group newer than the
    newest before the fault, announced or sampled before the next fault began and at most
    ``RECOVERY_MS`` after the heal): the time from the fault's start to the group's first
    acknowledgement by a primary of a newer epoch, after that epoch was first seen. A group
    that never acknowledged again counts until the last acknowledgement of the run."""
    primaries = sorted((s for s in h.roles if s.role == "primary"), key=lambda s: s.t_ms)
    acks = sorted((op for op in h.ops if op.type == OK and op.f in ("send", "delay", "txn")
                   and op.address), key=lambda op: op.complete_ms)
    last = acks[-1].complete_ms if acks else h.end_ms
    for i, fault in enumerate(h.faults):
        nxt = h.faults[i + 1].start_ms if i + 1 < len(h.faults) else h.end_ms
        until = min(nxt, (fault.heal_ms or h.end_ms) + RECOVERY_MS)
        for group in sorted({s.group for s in primaries}):
            mine = [s for s in primaries if s.group == group]
            before = max((s.epoch for s in mine if s.t_ms < fault.start_ms), default=0)
            new = [s for s in mine if s.epoch > before and fault.start_ms <= s.t_ms < until]
            if not new:
                continue
            seen: dict[str, int] = {}  # a newer primary's address → when first seen as such
            for s in mine:
                if s.epoch > before:
                    seen.setdefault(s.address, s.t_ms)
            back = next((op.complete_ms for op in acks if op.group == group
                         and op.address in seen and op.complete_ms >= seen[op.address]
                         and op.complete_ms >= fault.start_ms), last)
            name = f"{i + 1}. {fault.name}"
            r.failover_s[name] = max(r.failover_s.get(name, 0.0),
                                     max(0, back - fault.start_ms) / 1000)
