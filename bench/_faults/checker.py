"""The checker: what a history says about tidemq's promises. Pure (no I/O), so its unit tests
feed it hand-made histories, each holding one kind of violation.

Violations (each a count, with examples):

- ``lost``: acknowledged but never readable — a send acked ok, never read by a consumer and
  absent from the final read (retention may delete what was read: that is not loss);
  a transaction whose half was acked and whose producer decided commit, never visible; a timer
  acked, not cancelled, due long enough before the end, never delivered;
- ``duplicates``: one message id stored more than once in its topic (extra copies);
- ``unexpected``: read but never sent (no operation used that id), or sent with a definite
  failure and still read;
- ``order_violations``: two acked sends of one sharding key stored out of their send order;
- ``aborted_read``: a transaction its producer rolled back, visible to a consumer or stored;
- ``early_timers``: a delayed message read before its due time by the cluster's clock;
- ``after_cancel``: a delayed message read although its cancel was acknowledged;
- ``split_brain_acks``: a send (plain, delayed, or a transaction's half) acknowledged by a
  broker after another member of its group had
  become primary under a newer epoch (seen by the controller before the send began);
- ``offsets_backwards``: a consumer group's committed offset read back lower than an offset
  whose commit had been acknowledged before;
- ``crashes``: a service found dead after the run that no nemesis left dead (the harness
  restarts what it killed; anything else died by itself).

Measures: timer lateness p50/p99/max (first read minus due time) and, per fault, the longest
time any broker group acknowledged no send while it lasted (its unavailability window).
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from bench._faults.history import FAIL, OK, History, Op

VIOLATIONS = ("lost", "duplicates", "unexpected", "order_violations", "aborted_read",
              "early_timers", "after_cancel", "split_brain_acks", "offsets_backwards",
              "crashes")
TIMER_GRACE_MS = 10_000  # a timer due this long before the end must have been read by then
RECOVERY_MS = 20_000  # a fault's unavailability is looked for until this long after its heal
# a member's promotion may be sampled this long after its first acknowledgement as primary (the
# controller samples every 200 ms; under load a status answer took up to 8 s): epochs seen
# until then count. A member deposed, acknowledging, then promoted again within this window
# would be missed: such a split brain would still show as loss.
SAMPLE_SLACK_MS = 10_000
EXAMPLES = 5  # examples kept per violation kind


@dataclass
class Result:
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(VIOLATIONS, 0))
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    late_ms: list[int] = field(default_factory=list)
    unavailable_s: dict[str, float] = field(default_factory=dict)  # fault name → seconds
    acked: int = 0  # acknowledged sends, delayed sends and transaction halves
    reads: int = 0
    faults: int = 0

    def flag(self, kind: str, example: str, n: int = 1) -> None:
        self.counts[kind] += n
        if len(self.examples[kind]) < EXAMPLES:
            self.examples[kind].append(example)

    @property
    def ok(self) -> bool:
        return not any(self.counts.values())

    def late(self, q: float) -> int:
        if not self.late_ms:
            return 0
        ordered = sorted(self.late_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def to_json(self) -> dict[str, Any]:
        return {**self.counts, "late_p50_ms": self.late(0.5), "late_p99_ms": self.late(0.99),
                "late_max_ms": max(self.late_ms, default=0),
                "unavailable_s_max": round(max(self.unavailable_s.values(), default=0.0), 1),
                "faults_injected": self.faults, "acked": self.acked, "reads": self.reads}


def check(h: History) -> Result:
    r = Result(faults=len(h.faults))
    for name in h.crashed:
        r.flag("crashes", f"{name} died during the run")
    sent: dict[str, Op] = {}  # id → the operation that sent it (send, delay or txn)
    for op in h.ops:
        if op.f in ("send", "delay", "txn") and op.id:
            sent[op.id] = op
            r.acked += op.type == OK
    reads = list(h.by_kind("read"))
    r.reads = len(reads)
    stored = Counter((s.topic, s.id) for s in h.final)
    stored_ids = {s.id for s in h.final}
    read_ids = {op.id for op in reads}
    cancelled = {op.id for op in h.by_kind("cancel") if op.type == OK}
    _lost(h, r, stored_ids | read_ids)
    for (topic, mid), n in sorted(stored.items()):
        if n > 1:
            r.flag("duplicates", f"{mid} stored {n} times in {topic}", n - 1)
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
    _timers(h, r, reads, cancelled, sent)
    _split_brain(h, r)
    _offsets(h, r)
    _unavailability(h, r)
    return r


def _lost(h: History, r: Result, seen: set[str]) -> None:
    cancels = {op.id for op in h.by_kind("cancel") if op.type != FAIL}  # maybe cancelled
    for op in h.ops:
        if op.type != OK or op.id in seen:
            continue
        if op.f == "send":
            r.flag("lost", f"{op.id} acknowledged by {op.address or op.group} at "
                           f"{op.complete_ms}, never readable")
        elif op.f == "txn" and op.intent == "commit":
            r.flag("lost", f"transaction {op.id} committed ({op.end} first), never visible")
        elif (op.f == "delay" and op.id not in cancels
              and op.due_ms < h.end_ms - TIMER_GRACE_MS):
            r.flag("lost", f"timer {op.id} due at {op.due_ms} never delivered "
                           f"(end {h.end_ms})")


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


def _timers(h: History, r: Result, reads: list[Op], cancelled: set[str],
            sent: dict[str, Op]) -> None:
    first: dict[str, int] = {}
    for op in reads:
        if op.id not in first or op.complete_ms < first[op.id]:
            first[op.id] = op.complete_ms
    for mid, t in sorted(first.items()):
        found = sent.get(mid)
        if found is None or found.f != "delay":
            continue
        if t < found.due_ms:
            r.flag("early_timers", f"timer {mid} read at {t}, {found.due_ms - t} ms before "
                                   "due")
        else:
            r.late_ms.append(t - found.due_ms)
        if mid in cancelled:
            r.flag("after_cancel", f"timer {mid} read at {t} although cancelled")


def _split_brain(h: History, r: Result) -> None:
    samples = sorted(h.roles, key=lambda s: s.t_ms)
    for op in h.ops:
        if op.f not in ("send", "delay", "txn") or op.type != OK or not op.address:
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


def _offsets(h: History, r: Result) -> None:
    commits: dict[tuple[str, str, str, int], list[tuple[int, int]]] = defaultdict(list)
    for op in h.by_kind("commit_offset"):
        if op.type == OK:
            commits[(op.cgroup, op.group, op.topic, op.queue)].append((op.complete_ms,
                                                                        op.offset))
    for op in h.by_kind("fetch_offset"):
        if op.type != OK:
            continue
        before = [o for t, o in commits.get((op.cgroup, op.group, op.topic, op.queue), [])
                  if t < op.invoke_ms]
        if before and op.offset < max(before):
            r.flag("offsets_backwards", f"{op.cgroup} {op.group}/{op.topic}/{op.queue}: read "
                                        f"back {op.offset} after {max(before)} was committed")


def _unavailability(h: History, r: Result) -> None:
    acks: dict[str, list[int]] = defaultdict(list)
    for op in h.by_kind("send"):
        if op.type == OK and op.group:
            acks[op.group].append(op.complete_ms)
    for times in acks.values():
        times.sort()
    # sends stop before the end (reads go on): no ack after the last send began means nothing
    last = max((op.invoke_ms for op in h.by_kind("send")), default=h.end_ms)
    for i, fault in enumerate(h.faults):
        until = min(fault.heal_ms + RECOVERY_MS, last) if fault.heal_ms else last
        worst = 0
        for times in acks.values():
            # gaps between acks from the fault's start, up to the first ack past the window
            # (or the end of the run, when the group never acknowledged again)
            after = [t for t in times if t > fault.start_ms]
            inside = [t for t in after if t < until]
            later = after[len(inside):len(inside) + 1] or [max(until, fault.start_ms)]
            points = [fault.start_ms, *inside, *later]
            worst = max(worst, max(b - a for a, b in itertools.pairwise(points)))
        r.unavailable_s[f"{i + 1}. {fault.name}"] = worst / 1000


def table(r: Result, h: History) -> str:
    """The result as printed: violations, timers, and one line per fault."""
    lines = [f"{'check':<22}{'count':>8}  example", "-" * 78]
    for kind in VIOLATIONS:
        example = r.examples[kind][0] if r.examples[kind] else ""
        lines.append(f"{kind:<22}{r.counts[kind]:>8}  {example[:46]}")
    lines += ["-" * 78,
              f"acknowledged {r.acked}, reads {r.reads}, timers late p50/p99/max "
              f"{r.late(0.5)}/{r.late(0.99)}/{max(r.late_ms, default=0)} ms",
              f"{'fault':<44}{'family':<12}{'lasted s':>9}{'unavail s':>11}"]
    for i, fault in enumerate(h.faults):
        name = f"{i + 1}. {fault.name}"
        lasted = (fault.heal_ms - fault.start_ms) / 1000 if fault.heal_ms else 0.0
        lines.append(f"{name[:43]:<44}{fault.family:<12}{lasted:>9.1f}"
                     f"{r.unavailable_s.get(name, 0.0):>11.1f}")
    return "\n".join(lines)
