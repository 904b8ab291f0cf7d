"""Nemeses: each one fault, bounded in time and healed by the harness.

A nemesis is ``start`` (injects the fault, answers a note on what exactly it did), a hold
time, and ``heal``. Families: ``process`` (kill, pause), ``partition`` (cuts between hosts),
``link`` (loss and slowness), ``disk`` (a full data directory), ``files`` (damage to a stopped
broker's files), ``clock`` (a wall clock stepped forward and back), ``redis`` (the Redis master
killed under Sentinel).
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench._faults.cluster import A_HOSTS, Cluster, tail

Action = Callable[[Cluster], str]


@dataclass
class Nemesis:
    family: str
    name: str
    start: Action
    heal: Action
    hold_s: float
    # False: while it lasts no copy of some group can acknowledge to the workload, whatever
    # tidemq does (no side holds both a quorum of copies and etcd, the client cannot reach
    # the group, its disk is full); its unavailability is then the fault's length, and what
    # tidemq answers for is the recovery after the heal
    writable: bool = True


def _host(c: Cluster, name: str) -> str:
    return c.procs[name].host


def _others(c: Cluster, primary: str) -> list[str]:
    return [h for h in A_HOSTS if h != _host(c, primary)]


# --- process -------------------------------------------------------------------------------
def kill_primary() -> Nemesis:
    state: dict[str, str] = {}

    def start(c: Cluster) -> str:
        state["p"] = p = c.wait_primary_a()
        c.kill(p)
        return f"SIGKILL {p}"

    def heal(c: Cluster) -> str:
        c.restart(state["p"])
        return f"restarted {state['p']}"
    return Nemesis("process", "kill broker-a's primary", start, heal, 3.0)


def pause_primary() -> Nemesis:
    state: dict[str, str] = {}

    def start(c: Cluster) -> str:
        state["p"] = p = c.wait_primary_a()
        c.signal(p, signal.SIGSTOP)
        return f"SIGSTOP {p}"

    def heal(c: Cluster) -> str:
        c.signal(state["p"], signal.SIGCONT)
        return f"SIGCONT {state['p']}"
    return Nemesis("process", "pause broker-a's primary past its lease", start, heal, 5.0)


# --- partitions ----------------------------------------------------------------------------
def _healed(c: Cluster) -> str:
    c.net.heal()
    return "healed"


def primary_cut_from_etcd_and_replicas() -> Nemesis:
    def start(c: Cluster) -> str:
        p = c.wait_primary_a()
        c.net.partition([_host(c, p)], ["n5", *_others(c, p)])
        return f"{p} cut from etcd (n5) and its replicas; clients and nameserver-2 reach it"
    return Nemesis("partition", "primary cut from etcd and replicas", start, _healed, 6.0)


def replicas_split(etcd_with_primary: bool) -> Nemesis:
    def start(c: Cluster) -> str:
        p = c.wait_primary_a()
        one, two = [_host(c, p)], _others(c, p)
        (one if etcd_with_primary else two).append("n5")
        c.net.partition(one, two)
        return f"1|2 split {one} | {two}"
    side = "with the primary" if etcd_with_primary else "with the two"
    # etcd with the primary: the two replicas cannot elect, the primary has no quorum
    return Nemesis("partition", f"1|2 split of broker-a, etcd {side}", start, _healed, 7.0,
                   writable=not etcd_with_primary)


def bridge() -> Nemesis:
    def start(c: Cluster) -> str:
        p = c.wait_primary_a()
        c.net.partition([_host(c, p)], _others(c, p))
        return f"{p} cut from its replicas; etcd (n5) sees both halves"
    return Nemesis("partition", "bridge: etcd sees both halves", start, _healed, 7.0)


def client_cut_from_group_b() -> Nemesis:
    def start(c: Cluster) -> str:
        c.net.partition(["c1"], ["n4"])
        return "client c1 cut from broker-b (n4)"
    return Nemesis("partition", "client cut from broker-b", start, _healed, 5.0,
                   writable=False)


def nameserver_isolated() -> Nemesis:
    def start(c: Cluster) -> str:
        c.net.partition(["n7"], [h for h in c.net.hosts if h != "n7"])
        return "nameserver-1 (n7) cut from every host"
    return Nemesis("partition", "nameserver-1 isolated", start, _healed, 6.0)


# --- link ----------------------------------------------------------------------------------
def lossy_primary_link() -> Nemesis:
    def start(c: Cluster) -> str:
        p = c.wait_primary_a()
        return f"{p}: " + c.net.degrade(_host(c, p), loss_pct=20.0, delay_ms=100,
                                         rate_kbit=4000)
    return Nemesis("link", "20% loss and a slow link at the primary", start, _healed, 5.0)


# --- disk ----------------------------------------------------------------------------------
def fill(path: Path) -> int:
    """Take every free block of the filesystem holding ``path`` (a new file there); the bytes
    that were free."""
    st = os.statvfs(path.parent)
    free = st.f_bavail * st.f_frsize
    try:  # unbuffered: a write the full disk refuses leaves nothing for close() to flush
        out = open(path, "wb", buffering=0)
    except OSError:  # already full: not even a new file fits
        return 0
    with out:  # every free block, then whatever is left
        try:
            os.posix_fallocate(out.fileno(), 0, free)
        except OSError:
            pass
        out.seek(0, os.SEEK_END)
        block = b"\0" * 65536
        try:
            while out.write(block):
                pass
        except OSError:
            pass
    return free


def broker_b_disk_full() -> Nemesis:
    def filler(c: Cluster) -> Path:
        return Path(c.procs["b0"].env["TIDEMQ_BROKER_DATA_DIR"]) / "filler"

    def start(c: Cluster) -> str:
        path = filler(c)
        used = sum(f.stat().st_blocks * 512 for f in path.parent.rglob("*") if f.is_file())
        return (f"broker-b's data directory filled ({fill(path) // 1024} KiB free, its store "
                f"used {used // 1024} KiB)")

    def heal(c: Cluster) -> str:
        filler(c).unlink(missing_ok=True)
        return "space back"
    return Nemesis("disk", "broker-b's disk full", start, heal, 4.0, writable=False)


# --- files ---------------------------------------------------------------------------------
def damaged_replica_files(seed: int = 0) -> Nemesis:
    """Stop a replica of broker-a, then: its commit log's last record cut mid-way, one bit
    flipped in a sealed segment, in a consume queue, in an index file and in the checkpoint;
    restart it."""
    state: dict[str, str] = {}

    def start(c: Cluster) -> str:
        p = c.wait_primary_a()
        victim = next(n for n in ("a0", "a1", "a2") if n != p)
        state["v"] = victim
        c.kill(victim)
        store = Path(c.procs[victim].env["TIDEMQ_BROKER_DATA_DIR"]) / "store"
        rng = random.Random(seed)
        done = [f"stopped {victim}"]
        segments = sorted((store / "commitlog").iterdir())
        last = segments[-1]
        size = last.stat().st_size
        if size > 64:
            cut = size - rng.randrange(8, min(200, size // 2))
            os.truncate(last, cut)
            done.append(f"cut {last.name} at {cut} of {size}")
        if len(segments) > 1:
            done.append(_flip(segments[0], rng))
        cqs = sorted(p for p in (store / "consumequeue").rglob("*") if p.is_file()
                     and p.stat().st_size > 0)
        if cqs:
            done.append(_flip(rng.choice(cqs), rng))
        idx = sorted(p for p in (store / "index").iterdir() if p.is_file())
        if idx:
            done.append(_flip(idx[0], rng, limit=4096))
        ckpt = store / "checkpoint"
        if ckpt.exists():
            done.append(_flip(ckpt, rng))
        return "; ".join(done)

    def heal(c: Cluster) -> str:
        v = state["v"]
        c.restart(v, wait=False)
        try:
            c.wait_healthy(v, 90)
        except (TimeoutError, RuntimeError) as exc:
            return f"{v} did not come back: {exc}"
        return f"restarted {v}; " + _recovery_lines(c.procs[v].log)
    return Nemesis("files", "torn tail and flipped bits on a stopped replica", start, heal,
                   1.0)


def _flip(path: Path, rng: random.Random, limit: int = 0) -> str:
    size = path.stat().st_size
    at = rng.randrange(min(size, limit) if limit else size)
    bit = rng.randrange(8)
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ (1 << bit)]))
    return f"flipped bit {bit} of byte {at} in {path.parent.name}/{path.name}"


def _recovery_lines(log: Path) -> str:
    lines = [ln for ln in tail(log, 20000).splitlines()
             if any(w in ln for w in ("corrupt", "CRC", "truncat", "recovery", "checkpoint"))]
    return " | ".join(ln.split(": ", 1)[-1][:120] for ln in lines[-4:])


# --- clock ---------------------------------------------------------------------------------
def _set_clock(c: Cluster, name: str, offset_s: int) -> None:
    clock = c.procs[name].clock_file
    assert clock is not None, f"{name} does not run under libfaketime"
    clock.write_text(f"{offset_s:+d}s\n")


def primary_clock_jumps(step_s: int = 120) -> Nemesis:
    state: dict[str, str] = {}

    def start(c: Cluster) -> str:
        state["p"] = p = c.wait_primary_a()
        _set_clock(c, p, step_s)
        time.sleep(3.0)
        _set_clock(c, p, -step_s)
        return f"{p}'s wall clock +{step_s} s for 3 s, then -{step_s} s"

    def heal(c: Cluster) -> str:
        _set_clock(c, state["p"], 0)
        return "clock back"
    return Nemesis("clock", f"primary's wall clock jumps ±{step_s} s", start, heal, 3.0)


def bystander_clocks_jump(step_s: int = 120) -> Nemesis:
    """Wall clocks that must not matter: nameserver-1's (broker liveness is measured on the
    monotonic clock) and a broker-a replica's (it copies bytes; its election steps and the
    lease it would take are timed on the monotonic clock)."""
    state: dict[str, str] = {}

    def start(c: Cluster) -> str:
        p = c.wait_primary_a()
        state["r"] = r = next(n for n in ("a0", "a1", "a2") if n != p)
        for name in ("nameserver-1", r):
            _set_clock(c, name, step_s)
        time.sleep(2.0)
        for name in ("nameserver-1", r):
            _set_clock(c, name, -step_s)
        return f"nameserver-1's and {r}'s wall clocks +{step_s} s for 2 s, then -{step_s} s"

    def heal(c: Cluster) -> str:
        for name in ("nameserver-1", state["r"]):
            _set_clock(c, name, 0)
        return "clocks back"
    return Nemesis("clock", f"nameserver's and replica's clocks jump ±{step_s} s", start,
                   heal, 3.0)


def scheduler_clock_jumps(step_s: int = 60) -> Nemesis:
    def start(c: Cluster) -> str:
        _set_clock(c, "scheduler-a", step_s)
        time.sleep(3.0)
        _set_clock(c, "scheduler-a", -step_s)
        return f"scheduler-a's wall clock +{step_s} s for 3 s, then -{step_s} s"

    def heal(c: Cluster) -> str:
        _set_clock(c, "scheduler-a", 0)
        return "clock back"
    return Nemesis("clock", f"scheduler's wall clock jumps ±{step_s} s", start, heal, 3.0)


# --- redis ---------------------------------------------------------------------------------
def redis_master_killed() -> Nemesis:
    state: dict[str, str] = {}

    def start(c: Cluster) -> str:
        master = c.redis_master()
        state["m"] = master
        c.kill(master)
        return f"SIGKILL {master} (Sentinel promotes the replica)"

    def heal(c: Cluster) -> str:
        c.restart_redis(state["m"])
        return f"restarted {state['m']} as a replica"
    return Nemesis("redis", "Redis master killed under Sentinel", start, heal, 4.0)


def short_schedule() -> list[Nemesis]:
    """One of each family: what ``make test`` runs."""
    return [kill_primary(), primary_cut_from_etcd_and_replicas(), lossy_primary_link(),
            broker_b_disk_full(), damaged_replica_files(), bystander_clocks_jump(),
            redis_master_killed()]


def long_schedule(rounds: int) -> list[Nemesis]:
    """Every nemesis that must pass, ``rounds`` times (the benchmark)."""
    out: list[Nemesis] = []
    for _ in range(rounds):  # fresh nemeses: each keeps its own state between start and heal
        out += [kill_primary(), pause_primary(), primary_cut_from_etcd_and_replicas(),
                replicas_split(True), replicas_split(False), bridge(),
                client_cut_from_group_b(), nameserver_isolated(), lossy_primary_link(),
                broker_b_disk_full(), damaged_replica_files(len(out)),
                bystander_clocks_jump(), redis_master_killed()]
    return out


def clock_limits() -> list[Nemesis]:
    """The clocks tidemq's timers and checks depend on, stepped (docs/reliability.md, "Known
    limits"): their violations are expected and documented, not fixed."""
    return [primary_clock_jumps(), scheduler_clock_jumps()]
