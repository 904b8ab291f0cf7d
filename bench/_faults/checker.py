"""The checker: what a history says about tidemq's promises. Pure (no I/O), so its unit tests
feed it hand-made histories, each holding one kind of violation.

Violations (each a count, with examples):

- ``lost``: acknowledged but gone — a send acked ok, a transaction whose half was acked and
  whose producer decided commit, or a timer acked, not cancelled and due long enough before the
  end, absent from the final read although its position is not below the queue's first stored
  offset (a consumer having read it does not excuse its absence: the test topic keeps
  everything), or never read at all;
- ``skipped_by_group``: such an id in the final read that one subscribing consumer group never
  read (one count per group that missed it);
- ``unverifiable``: such an id absent from the final read because its position is below the
  queue's first stored offset (retention): neither delivered nor lost can be shown. The test
  topics keep everything, so any is a failure of the harness;
- ``duplicates``: one message id stored more than once in its topic (extra copies), or read by
  one consumer group at two different (queue, offset) positions — except one copy in each of
  two groups of an SDK send during which the SDK's ``possible_duplicates`` grew: its documented
  failover case (tidemq/_fault.py), counted as ``sdk_possible_duplicates``;
- ``unexpected``: read but never sent (no operation used that id), or sent with a definite
  failure and still read;
- ``order_violations``: two acked sends of one sharding key stored out of their send order;
- ``aborted_read``: a transaction its producer rolled back, visible to a consumer or stored;
- ``early_timers``: a delayed message whose delivered copy was stored (``store_timestamp_ms``, the
  broker's clock) before the due time the send's answer gave (``deliver_at_ms``), or whose cancel
  was answered "already delivered" before that time;
- ``late_timers``: the p99 of timer lateness (first delivered copy's store time minus due time),
  over timers due outside every fault window, above ``LATE_P99_LIMIT_MS``;
- ``after_cancel``: a delayed message read, or found in the final read, although its cancel was
  acknowledged;
- ``split_brain_acks``: a send (plain, delayed, or a transaction's half) acknowledged by a
  broker after another member of its group had
  become primary under a newer epoch (sampled by the controller, or announced in etcd and seen
  by its watch, before the send began);
- ``offsets_backwards``: a consumer group's committed offset read back lower than an offset
  whose commit had been acknowledged before;
- ``offsets_forward``: a committed offset read back higher than any offset the group had asked to
  commit (acknowledged or not) by then: the messages it jumps over were never processed;
- ``replica_divergence``: two members of a replicated group holding different ids at one
  (queue, offset) in the final read, or one lacking, inside the range it holds, a position
  another member holds (a hole it never serves);
- ``crashes``: a service found dead after the run that no nemesis left dead (the harness
  restarts what it killed; anything else died by itself);
- ``too_little_work``: one of the minimums ``check`` was given (operations of each kind, retries,
  failovers) not reached: a run that exercised too little proves nothing.

Measures: timer lateness p50/p99/max, per fault the longest time any broker group acknowledged
no send while one was asked of it (its unavailability window: ``timing.check_unavailability``),
per fault that brought a new primary the
time from its start to the new primary's first acknowledgement (``failover_s``), operations that
ended unknown per kind and how many of those sends were never read (``unknown_never_read``:
fine, an unknown send may not have been stored), and the work done (``work``: acknowledged
operations per kind, retries, failovers).
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from bench._faults.history import FAIL, INFO, OK, History, Op
from bench._faults.timing import (
    ALREADY_DELIVERED,
    RECOVERY_MS,
    check_failovers,
    check_offsets,
    check_timers,
    check_unavailability,
    due_of,
)

VIOLATIONS = ("lost", "skipped_by_group", "unverifiable", "duplicates", "unexpected",
              "order_violations", "aborted_read", "early_timers", "late_timers",
              "after_cancel", "split_brain_acks", "offsets_backwards", "offsets_forward",
              "replica_divergence", "crashes", "too_little_work")
TIMER_GRACE_MS = 10_000  # a timer due this long before the end must have been read by then
# a member's promotion may be sampled this long after its first acknowledgement as primary (the
# controller samples every 200 ms; under load a status answer took up to 8 s): epochs seen
# until then count. A member deposed, acknowledging, then promoted again within this window
# would be missed: such a split brain would still show as loss.
SAMPLE_SLACK_MS = 10_000
EXAMPLES = 5  # examples kept per violation kind
WRITES = ("send", "delay", "txn")


@dataclass
class Result:
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(VIOLATIONS, 0))
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    late_ms: list[int] = field(default_factory=list)  # every delivered timer
    late_calm_ms: list[int] = field(default_factory=list)  # ... due outside fault windows
    # ... not due while a fault no side could write through lasted (Fault.writable)
    late_writable_ms: list[int] = field(default_factory=list)
    unavailable_s: dict[str, float] = field(default_factory=dict)  # fault name → seconds
    # faults no side could write through → seconds of their worst gap past the heal
    recovery_s: dict[str, float] = field(default_factory=dict)
    acked: int = 0  # acknowledged sends, delayed sends and transaction halves
    reads: int = 0
    faults: int = 0
    unknown: dict[str, int] = field(default_factory=dict)  # operations ended info, per kind
    unknown_never_read: int = 0  # unknown sends, timers, halves never read nor stored
    work: dict[str, int] = field(default_factory=dict)  # ok operations per kind, retries…
    app_errors: int = 0  # SDK calls that raised (what the application saw)
    app_cancels_too_late: int = 0  # SDK cancels answered 409 ALREADY_DELIVERED (an outcome)
    sdk_possible_duplicates: int = 0  # copies in two groups the SDK counted as possible
    app_wait_s: dict[str, float] = field(default_factory=dict)  # fault → longest SDK call
    # fault that brought a new primary → seconds from its start to the group's first
    # acknowledgement by the new primary
    failover_s: dict[str, float] = field(default_factory=dict)

    def flag(self, kind: str, example: str, n: int = 1) -> None:
        self.counts[kind] += n
        if len(self.examples[kind]) < EXAMPLES:
            self.examples[kind].append(example)

    @property
    def ok(self) -> bool:
        return not any(self.counts.values())

    def late(self, q: float, calm: bool = False, writable: bool = False) -> int:
        values = (self.late_calm_ms if calm else self.late_writable_ms if writable
                  else self.late_ms)
        if not values:
            return 0
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def failover(self, q: float) -> float:
        ordered = sorted(self.failover_s.values())
        if not ordered:
            return 0.0
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)

    def to_json(self) -> dict[str, Any]:
        return {**self.counts, "late_p50_ms": self.late(0.5), "late_p99_ms": self.late(0.99),
                "late_calm_p99_ms": self.late(0.99, calm=True),
                "late_writable_p99_ms": self.late(0.99, writable=True),
                "late_max_ms": max(self.late_ms, default=0),
                "unavailable_s_max": round(max(self.unavailable_s.values(), default=0.0), 1),
                "unavailable_writable_s_max": round(max(
                    (s for name, s in self.unavailable_s.items() if name not in self.recovery_s),
                    default=0.0), 1),
                "recovery_s_max": round(max(self.recovery_s.values(), default=0.0), 1),
                "recovery_s": dict(self.recovery_s),
                "faults_injected": self.faults, "acked": self.acked, "reads": self.reads,
                "unknown": dict(self.unknown), "unknown_never_read": self.unknown_never_read,
                "work": dict(self.work), "app_errors": self.app_errors,
                "app_cancels_too_late": self.app_cancels_too_late,
                "sdk_possible_duplicates": self.sdk_possible_duplicates,
                "app_wait_s_max": round(max(self.app_wait_s.values(), default=0.0), 1),
                "app_wait_s": dict(self.app_wait_s),
                "failover_s_p50": self.failover(0.5), "failover_s_max": self.failover(1.0),
                "failover_s": dict(self.failover_s)}


def check(h: History, minimums: dict[str, int] | None = None) -> Result:
    """Judge a history; ``minimums``: the least work (``work`` keys) a run must show."""
    r = Result(faults=len(h.faults))
    for name in h.crashed:
        r.flag("crashes", f"{name} died during the run")
    sent: dict[str, Op] = {}  # id → the operation that sent it (send, delay or txn)
    for op in h.ops:
        if op.f in WRITES and op.id:
            sent[op.id] = op
            r.acked += op.type == OK
    reads = list(h.by_kind("read"))
    r.reads = len(reads)
    stored = Counter((s.topic, s.id) for s in h.final)
    stored_ids = {s.id for s in h.final}
    read_ids = {op.id for op in reads}
    cancelled = {op.id for op in h.by_kind("cancel") if op.type == OK}
    _delivery(h, r, reads, stored_ids)
    doubled: set[str] = set()
    groups_of: dict[str, set[str]] = defaultdict(set)
    for s in h.final:
        groups_of[s.id].add(s.group)
    for (topic, mid), n in sorted(stored.items()):
        if n > 1:
            doubled.add(mid)
            found = sent.get(mid)
            if (found is not None and found.possible_dup and n == 2
                    and len(groups_of[mid]) == 2):
                r.sdk_possible_duplicates += 1  # the SDK's documented case, and it said so
            else:
                r.flag("duplicates", f"{mid} stored {n} times in {topic}", n - 1)
    _consumed_twice(r, reads, doubled)
    for mid in sorted(stored_ids | read_ids):
        found = sent.get(mid)
        if found is None:
            r.flag("unexpected", f"{mid} was read but never sent")
        elif found.type == FAIL:
            r.flag("unexpected", f"{mid} was read although its {found.f} failed "
                                 f"({found.error})")
    for op in h.by_kind("txn"):
        if op.intent == "rollback" and (op.id in stored_ids or op.id in read_ids):
            r.flag("aborted_read", f"transaction {op.id} rolled back ({op.end} first) but "
                                   "visible")
    _order(h, r)
    check_timers(h, r, reads, cancelled, sent)
    _split_brain(h, r)
    check_offsets(h, r)
    _replicas(h, r)
    check_unavailability(h, r)
    check_failovers(h, r)
    _work(h, r, stored_ids | read_ids, minimums or {})
    _application(h, r)
    return r


def must_deliver(h: History) -> list[Op]:
    """The acknowledged operations whose message every subscribing group must get: sends,
    committed transactions, and timers neither (maybe) cancelled nor due near the end."""
    cancels = {op.id for op in h.by_kind("cancel") if op.type != FAIL}  # maybe cancelled
    out = []
    for op in h.ops:
        if op.type != OK:
            continue
        due = due_of(op)
        if (op.f == "send" or (op.f == "txn" and op.intent == "commit")
                or (op.f == "delay" and op.id not in cancels
                    and due < h.end_ms - TIMER_GRACE_MS)):
            out.append(op)
    return out


def _delivery(h: History, r: Result, reads: list[Op], stored_ids: set[str]) -> None:
    """Loss per consumer group, judged on a complete final read."""
    by_group: dict[str, set[str]] = defaultdict(set)
    where: dict[str, tuple[str, int, int]] = {}  # id → a (group, queue, offset) it held
    for op in reads:
        by_group[op.cgroup].add(op.id)
        where.setdefault(op.id, (op.group, op.queue, op.offset))
    cgroups = h.cgroups or sorted(by_group)
    for op in must_deliver(h):
        what = {"send": f"{op.id} acknowledged by {op.address or op.group} at "
                        f"{op.complete_ms}",
                "txn": f"transaction {op.id} committed ({op.end} first)",
                "delay": f"timer {op.id} due at {due_of(op)}"}[op.f]
        if op.id in stored_ids:
            for cg in cgroups:
                if op.id not in by_group[cg]:
                    r.flag("skipped_by_group", f"{what}: stored, never read by {cg}")
            continue
        group, queue, offset = where.get(op.id, (op.group, op.queue, op.offset))
        first = h.min_offsets.get(f"{group}/{queue}", 0)
        if offset >= 0 and offset < first:
            r.flag("unverifiable", f"{what}: at {group}/{queue}/{offset}, below the first "
                                   f"stored offset {first}")
        else:
            readers = sorted(cg for cg in cgroups if op.id in by_group[cg])
            r.flag("lost", f"{what}, not in the final read (read by "
                           f"{', '.join(readers) or 'no group'})")


def _consumed_twice(r: Result, reads: list[Op], doubled: set[str]) -> None:
    """One group reading one id at two positions (stored twice, maybe deleted since)."""
    positions: dict[tuple[str, str], set[tuple[str, int, int]]] = defaultdict(set)
    for op in reads:
        positions[(op.cgroup, op.id)].add((op.group, op.queue, op.offset))
    for (cg, mid), seen in sorted(positions.items()):
        if len(seen) > 1 and mid not in doubled:
            at = ", ".join(f"{g}/{q}/{o}" for g, q, o in sorted(seen))
            r.flag("duplicates", f"{mid} read by {cg} at {at}", len(seen) - 1)


def _order(h: History, r: Result) -> None:
    acked = {op.id for op in h.by_kind("send") if op.type == OK}
    by_key: dict[str, list[tuple[int, int, int, str]]] = defaultdict(list)
    seen: set[str] = set()
    for s in h.final:
        if s.key is None or s.id in seen or s.id not in acked:
            continue
        seen.add(s.id)
        by_key[s.key].append((s.queue, s.offset, s.seq, s.id))
    for key, items in by_key.items():
        items.sort()
        for (_, _, a_seq, a), (_, _, b_seq, b) in itertools.pairwise(items):
            if b_seq <= a_seq:
                r.flag("order_violations", f"key {key}: {b} (#{b_seq}) stored after {a} "
                                           f"(#{a_seq})")


def _split_brain(h: History, r: Result) -> None:
    samples = sorted(h.roles, key=lambda s: s.t_ms)
    for op in h.ops:
        if op.f not in WRITES or op.type != OK or not op.address:
            continue
        mine = max((s.epoch for s in samples if s.address == op.address
                    and s.role == "primary" and s.t_ms <= op.complete_ms + SAMPLE_SLACK_MS),
                   default=None)
        if mine is None:
            continue
        newer = [s for s in samples if s.group == op.group and s.address != op.address
                 and s.role == "primary" and s.epoch > mine and s.t_ms < op.invoke_ms]
        if newer:
            first = newer[0]
            r.flag("split_brain_acks", f"{op.id} acknowledged by {op.address} (epoch {mine}) "
                                       f"at {op.complete_ms}; {first.address} was primary "
                                       f"under epoch {first.epoch} since {first.t_ms}")


def _replicas(h: History, r: Result) -> None:
    """Every member of a replicated group holds the same id at each (queue, offset) they both
    hold (a member may be shorter: it may still be catching up), and no member lacks, between
    the first and last offsets it holds, a position another member holds (a hole: a record it
    never serves, which its consumers skip once it leads)."""
    held: dict[tuple[str, int, int], dict[str, str]] = defaultdict(dict)
    spans: dict[tuple[str, int, str], tuple[int, int]] = {}  # (group, queue, member) → range
    for address, records in sorted(h.replicas.items()):
        for s in records:
            held[(s.group, s.queue, s.offset)][address] = s.id
            lo, hi = spans.get((s.group, s.queue, address), (s.offset, s.offset))
            spans[(s.group, s.queue, address)] = (min(lo, s.offset), max(hi, s.offset))
    for (group, queue, offset), ids in sorted(held.items()):
        if len(set(ids.values())) > 1:
            shown = ", ".join(f"{a}: {i}" for a, i in sorted(ids.items()))
            r.flag("replica_divergence", f"{group}/{queue}/{offset} holds {shown}")
        for (g, q, address), (lo, hi) in sorted(spans.items()):
            if g == group and q == queue and lo < offset < hi and address not in ids:
                other, mid = sorted(ids.items())[0]
                r.flag("replica_divergence", f"{group}/{queue}/{offset}: {address} has a hole "
                                             f"where {other} holds {mid}")


def _work(h: History, r: Result, seen: set[str], minimums: dict[str, int]) -> None:
    """Count what the run did (and what ended unknown), and hold it to the minimums."""
    for op in h.ops:
        if op.type == OK:
            r.work[op.f] = r.work.get(op.f, 0) + 1
            if op.f == "read" and op.client:  # per consumer group of the SDK share
                r.work[f"read_{op.cgroup}"] = r.work.get(f"read_{op.cgroup}", 0) + 1
            elif op.client:  # the SDK share's own count of each kind
                r.work[f"{op.client}_{op.f}"] = r.work.get(f"{op.client}_{op.f}", 0) + 1
        elif op.type == INFO:
            r.unknown[op.f] = r.unknown.get(op.f, 0) + 1
            r.unknown_never_read += op.f in WRITES and op.id not in seen
        r.work["retries"] = r.work.get("retries", 0) + (op.attempts > 1)
    epochs = {(s.group, s.epoch) for s in h.roles if s.role == "primary"}
    groups = {g for g, _ in epochs}
    r.work["failovers"] = len(epochs) - len(groups)
    for kind, least in sorted(minimums.items()):
        if r.work.get(kind, 0) < least:
            r.flag("too_little_work", f"{r.work.get(kind, 0)} {kind}, fewer than {least}")


def _application(h: History, r: Result) -> None:
    """What the SDK share's application saw: calls that raised (a cancel answered "already
    delivered" is the contract's answer to a cancel that came too late, not retriable, which
    issue 32 lets an application see: counted apart, and ``early_timers`` judges that it was
    not answered before the due time), and per fault the longest call begun while it lasted
    (or in the recovery after it, until the next fault began)."""
    calls = [op for op in h.ops if op.client == "sdk"]
    late = [op for op in calls if op.f == "cancel" and op.type == FAIL
            and ALREADY_DELIVERED in op.error]
    r.app_cancels_too_late = len(late)
    r.app_errors = sum(op.type != OK for op in calls) - len(late)
    for i, fault in enumerate(h.faults):
        nxt = h.faults[i + 1].start_ms if i + 1 < len(h.faults) else h.end_ms
        until = min((fault.heal_ms or h.end_ms) + RECOVERY_MS, nxt)
        waits = [op.complete_ms - op.invoke_ms for op in calls
                 if fault.start_ms <= op.invoke_ms < until]
        r.app_wait_s[f"{i + 1}. {fault.name}"] = max(waits, default=0) / 1000


def table(r: Result, h: History) -> str:
    """The result as printed: violations, timers, work done, and one line per fault."""
    summary = r.to_json()
    lines = [f"{'check':<22}{'count':>8}  example", "-" * 78]
    for kind in VIOLATIONS:
        example = r.examples[kind][0] if r.examples[kind] else ""
        lines.append(f"{kind:<22}{r.counts[kind]:>8}  {example[:46]}")
    work = ", ".join(f"{k} {v}" for k, v in sorted(r.work.items()))
    unknown = ", ".join(f"{k} {v}" for k, v in sorted(r.unknown.items())) or "none"
    lines += ["-" * 78,
              f"acknowledged {r.acked}, reads {r.reads}, timers late p50/p99/max "
              f"{r.late(0.5)}/{r.late(0.99)}/{max(r.late_ms, default=0)} ms (p99 outside "
              f"faults {r.late(0.99, calm=True)} ms; not due during a fault marked * "
              f"{r.late(0.99, writable=True)} ms)",
              f"work: {work}",
              f"ended unknown: {unknown}; unknown writes never read: {r.unknown_never_read}; "
              f"SDK calls that raised: {r.app_errors} (and {r.app_cancels_too_late} cancels "
              f"answered already delivered), copies in two groups it announced "
              f"(possible_duplicates): {r.sdk_possible_duplicates}",
              f"failovers p50/max {r.failover(0.5)}/{r.failover(1.0)} s",
              f"unavailable max {summary['unavailable_s_max']} s; where a side could write "
              f"{summary['unavailable_writable_s_max']} s; past the heal of the faults no "
              f"side could write through (*) {summary['recovery_s_max']} s",
              f"{'fault':<40}{'family':<11}{'lasted s':>9}{'unavail s':>10}{'app wait s':>11}"
              f"{'failover s':>11}{'healed+ s':>10}"]
    for i, fault in enumerate(h.faults):
        name = f"{i + 1}. {fault.name}"
        lasted = (fault.heal_ms - fault.start_ms) / 1000 if fault.heal_ms else 0.0
        mark = "" if fault.writable else " *"
        lines.append(f"{(name[:39 - len(mark)] + mark):<40}{fault.family:<11}{lasted:>9.1f}"
                     f"{r.unavailable_s.get(name, 0.0):>10.1f}{r.app_wait_s.get(name, 0.0):>11.1f}"
                     f"{_seconds(r.failover_s.get(name)):>11}"
                     f"{_seconds(r.recovery_s.get(name)):>10}")
    return "\n".join(lines)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"

