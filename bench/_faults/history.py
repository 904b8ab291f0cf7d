"""The history of one faults run: every operation the workload tried, with its outcome and
times, plus what the controller saw (broker roles over time, faults, the final read).

One JSON object per line. Times are the real clock of the machine (epoch ms): every namespace
host shares it, so they are the cluster's clock (a host whose clock a nemesis moves runs its
service under libfaketime; the workload and controller never do).

Operation kinds (``f``) and their fields besides ``type``/``invoke_ms``/``complete_ms``:

- ``send``: ``id``, ``topic``, ``key`` (sharding key or None), ``seq`` (its order within the
  key), ``group``/``address`` (who answered ok), ``queue``/``offset``; ``batch`` (how many
  messages the request carried: one op per message);
- ``delay``: ``id``, ``topic``, ``due_ms`` (by the cluster's clock: the earliest the message may
  be delivered), ``deliver_at_ms`` (the due time the broker's answer gave: the contract),
  ``address``;
- ``cancel``: ``id``; ``type`` ok = cancelled, fail = already delivered (409);
- ``txn``: ``id``, ``topic``, ``intent`` ("commit" / "rollback": what the producer's local
  transaction decided and every check-back answers), ``end`` ("commit", "rollback", "unknown":
  what the producer sent first);
- ``read``: ``id``, ``topic``, ``cgroup`` (consumer group), ``group``, ``queue``, ``offset``,
  ``store_ms`` (the copy's ``store_timestamp_ms``: the broker's clock) (``type`` is always ok;
  ``complete_ms`` is when the consumer got it);
- ``commit_offset``: ``cgroup``, ``group``, ``topic``, ``queue``, ``offset``;
- ``fetch_offset``: same fields: the committed offset a consumer read back.

``type``: ``ok`` (acknowledged), ``fail`` (definitely not done: a 4xx answer), ``info`` (unknown:
a timeout, a 5xx after the request may have been written). ``attempts``: how many requests an
operation took (more than one: it was retried); ``client`` "sdk": an operation of the SDK share
(bench/_faults/sdk_share.py), whose retries the SDK hides.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

OK, FAIL, INFO = "ok", "fail", "info"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Op:
    f: str
    type: str
    invoke_ms: int
    complete_ms: int
    id: str = ""
    topic: str = ""
    key: str | None = None
    seq: int = 0
    group: str = ""
    address: str = ""
    queue: int = -1
    offset: int = -1
    due_ms: int = 0
    intent: str = ""
    end: str = ""
    cgroup: str = ""
    error: str = ""
    deliver_at_ms: int = 0
    store_ms: int = 0
    attempts: int = 0
    batch: int = 0
    client: str = ""  # "sdk": sent through the tidemq SDK (else raw REST)
    # the SDK's ``possible_duplicates`` grew during the call: it failed over to another group
    # after an attempt whose answer was lost (its documented case of two copies, one per group)
    possible_dup: bool = False

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items()
                           if v not in ("", None, -1) or k in ("f", "type")})

    @classmethod
    def from_json(cls, line: str) -> Op:
        return cls(**json.loads(line))


@dataclass(frozen=True)
class RoleSample:
    """One look at a broker: ``(t_ms, group, address, role, epoch)``."""

    t_ms: int
    group: str
    address: str
    role: str
    epoch: int


@dataclass
class Fault:
    """One injected fault: its family (``kill``, ``partition``…), what it did, when it
    started and when the harness healed it."""

    family: str
    name: str
    start_ms: int
    heal_ms: int = 0
    note: str = ""
    writable: bool = True  # a side could acknowledge while it lasted (Nemesis.writable)


@dataclass(frozen=True)
class Stored:
    """One record found by the final read of a topic, in queue order."""

    id: str
    topic: str
    group: str
    queue: int
    offset: int
    key: str | None = None
    seq: int = 0
    store_ms: int = 0  # its store_timestamp_ms (broker's clock)
    address: str = ""  # the member read ("" : the group's primary)


@dataclass
class History:
    ops: list[Op] = field(default_factory=list)
    roles: list[RoleSample] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    final: list[Stored] = field(default_factory=list)
    end_ms: int = 0  # when the workload stopped (timers due later are not judged)
    crashed: list[str] = field(default_factory=list)  # services found dead after the run
    # the final read's first stored offset per queue, ``"group/queue" → offset``: records below
    # it are gone (retention) and can be judged neither delivered nor lost
    min_offsets: dict[str, int] = field(default_factory=dict)
    # the final read of every member of a replicated group, ``address → records``
    replicas: dict[str, list[Stored]] = field(default_factory=dict)
    cgroups: list[str] = field(default_factory=list)  # the consumer groups that subscribe

    def by_kind(self, f: str) -> Iterator[Op]:
        return (op for op in self.ops if op.f == f)


def write_ops(path: Path, ops: Iterable[Op]) -> None:
    with open(path, "a") as out:
        for op in ops:
            out.write(op.to_json() + "\n")


def read_ops(path: Path) -> list[Op]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                out.append(Op.from_json(line))
            except (ValueError, TypeError):
                continue  # a line torn by a killed writer
    return out


def dump(history: History, path: Path) -> None:
    """The whole history as one JSON file (kept beside a failed run)."""
    path.write_text(json.dumps({
        "ops": [asdict(o) for o in history.ops], "roles": [asdict(r) for r in history.roles],
        "faults": [asdict(f) for f in history.faults],
        "final": [asdict(s) for s in history.final], "end_ms": history.end_ms,
        "crashed": history.crashed, "min_offsets": history.min_offsets,
        "replicas": {a: [asdict(s) for s in rs] for a, rs in history.replicas.items()},
        "cgroups": history.cgroups}))


def load(path: Path) -> History:
    raw: dict[str, Any] = json.loads(path.read_text())
    return History([Op(**o) for o in raw["ops"]], [RoleSample(**r) for r in raw["roles"]],
                   [Fault(**f) for f in raw["faults"]], [Stored(**s) for s in raw["final"]],
                   raw["end_ms"], raw.get("crashed", []), raw.get("min_offsets", {}),
                   {a: [Stored(**s) for s in rs] for a, rs in raw.get("replicas", {}).items()},
                   raw.get("cgroups", []))
