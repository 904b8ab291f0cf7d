"""One faults run: hosts up, tidemq on them, the workload on the client host, the nemeses one
after another, everything healed, the final read, the checker.

``run(schedule, workdir)`` returns the history and the checker's result; the namespaces, mounts
and processes are gone afterwards whatever happened (and leftovers of a crashed run are removed
at the start of the next).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from bench._faults.checker import Result, check
from bench._faults.cluster import CLUSTER, GROUP_A, GROUP_B, HOSTS, Cluster, tail
from bench._faults.etcdwatch import PrimaryWatch
from bench._faults.history import (
    Fault,
    History,
    RoleSample,
    Stored,
    dump,
    now_ms,
    read_ops,
)
from bench._faults.nemesis import Nemesis
from bench._faults.netns import Network
from bench._faults.sdk_share import SDK_GROUPS
from bench._faults.workload import CONSUMER_GROUPS, Config

TOPIC = "FaultsT"
QUEUES = 4
WARMUP_S = 3.0  # the workload runs this long before the first fault
GAP_S = 3.0  # after a fault is healed, before the next one
DRAIN_S = 12.0  # after the last operation: timers come due, checks resolve, consumers read
FINAL_READ_RETRIES = 3  # an empty answer that skips offsets is asked again this often
# the least work a run must show to prove anything (``Result.work`` keys; the short schedule's
# seven faults bring one failover of broker-a at least: its primary is killed)
MINIMUMS: Mapping[str, int] = {"send": 1000, "delay": 100, "cancel": 10, "txn": 50,
                               "read": 2000, "commit_offset": 50, "fetch_offset": 20,
                               "retries": 5, "failovers": 1}
# ... and of the SDK share, when it runs (``sdk_*``: its operations of a kind; ``read_<group>``:
# messages the SDK consumer groups got)
SDK_MINIMUMS: Mapping[str, int] = {"sdk_send": 200, "sdk_delay": 20, "sdk_cancel": 3,
                                   "sdk_txn": 20, "read_cg-push": 500, "read_cg-simple": 500}
SDK_READS = {f"read_{g}" for g in SDK_GROUPS}
# ... and of the gRPC share (the official RocketMQ 5 client), when it runs
GRPC_MINIMUMS: Mapping[str, int] = {"grpc_send": 50}


@dataclass
class Run:
    history: History
    result: Result
    workdir: Path
    seconds: float


class Monitor:
    """Samples each broker-a member's role every ``interval_s``, one thread per member, so a
    paused or cut-off member does not delay the others' samples (the controller reaches every
    host whatever the partitions)."""

    def __init__(self, cluster: Cluster, interval_s: float = 0.2) -> None:
        self.cluster = cluster
        self.interval_s = interval_s
        self.samples: list[RoleSample] = []
        self.done = threading.Event()
        self._threads = [threading.Thread(target=self._watch, args=(name,), daemon=True,
                                          name=f"faults-monitor-{name}")
                         for name in ("a0", "a1", "a2")]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def _watch(self, name: str) -> None:
        while not self.done.is_set():
            try:
                sample = self.cluster.sample_role(name)
            except Exception:
                sample = None  # a sample missed is a sample missed
            if sample is not None:
                self.samples.append(sample)  # list.append is atomic under the GIL
            self.done.wait(self.interval_s)


def run(schedule: list[Nemesis], workdir: Path, *, writers: int = 8,
        long_delay_max_ms: int = 0, log: Any = print,
        minimums: Mapping[str, int] = {**MINIMUMS, **SDK_MINIMUMS, **GRPC_MINIMUMS},
        sdk_writers: int = 2, grpc: bool = True, lease_s: float | None = None) -> Run:
    """``long_delay_max_ms``: one delayed message in ten waits up to this long (0: none; the
    drain waits for them, up to ``Config.timer_wait_max_s``). ``minimums``: the least work
    the checker requires (those of the SDK share are dropped without it). ``sdk_writers``: writers
    of the SDK share (bench/_faults/sdk_share.py; none: no SDK consumer groups either).
    ``grpc``: a writer sends through the official RocketMQ 5 client
    (bench/_faults/grpc_share.py). ``lease_s``: broker-a's lease (None: the broker's default)."""
    began = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    net = Network(HOSTS)
    cluster: Cluster | None = None
    monitor: Monitor | None = None
    try:
        net.up()
        cluster = Cluster(net, workdir, lease_s=lease_s).start()
        _settle(cluster)
        cluster.create_topic(TOPIC, QUEUES)
        log(f"cluster up in {time.monotonic() - began:.0f} s; primary of broker-a: "
            f"{cluster.primary_a()}")
        monitor = Monitor(cluster)
        monitor.start()
        watch = PrimaryWatch(cluster.url("n5", 2379), CLUSTER, GROUP_A).start()
        length = 60.0 * (len(schedule) + 1)  # at most: the controller stops it (stop file)
        history_path = workdir / "history.jsonl"
        stop = workdir / "stop"
        cfg = Config(nameservers=cluster.nameservers, groups=[GROUP_A, GROUP_B], topic=TOPIC,
                     out=str(history_path), duration_s=length, drain_s=DRAIN_S,
                     writers=writers, stop_file=str(stop), sdk_writers=sdk_writers,
                     grpc_endpoints=cluster.grpc_endpoints if grpc else "",
                     long_delay_max_ms=long_delay_max_ms)
        (workdir / "workload.json").write_text(json.dumps(asdict(cfg)))
        wl_log = open(workdir / "workload.log", "ab")
        workload = subprocess.Popen(net.exec_argv("c1", [
            sys.executable, "-m", "bench._faults.workload", str(workdir / "workload.json")]),
            stdout=wl_log, stderr=wl_log, cwd=Path(__file__).resolve().parents[2])
        wl_log.close()
        try:
            faults = _inject(cluster, schedule, log)
        finally:
            stop.touch()  # the last fault healed (GAP_S ago): operations stop, reads go on
        code = workload.wait(length + DRAIN_S + 120)
        end = now_ms()
        net.heal()
        monitor.done.set()
        watch.done.set()
        log(f"  etcd announced {len(watch.samples)} primaries of broker-a "
            f"({watch.errors} watch errors)")
        crashed = _revive(cluster, log)
        history = History(read_ops(history_path), monitor.samples + watch.samples, faults, [],
                          end, crashed,
                          cgroups=list(CONSUMER_GROUPS) + list(SDK_GROUPS if sdk_writers else ()))
        dump(history, workdir / "history.json")  # kept for a look whatever follows
        if code != 0:
            raise RuntimeError(f"the workload failed ({code}):\n{tail(workdir / 'workload.log')}")
        history.final, history.min_offsets = final_read(cluster)
        history.replicas = read_replicas(cluster, log)
        dump(history, workdir / "history.json")
        least = {k: v for k, v in minimums.items()
                 if (sdk_writers or not (k.startswith("sdk_") or k in SDK_READS))
                 and (grpc or not k.startswith("grpc_"))}
        result = check(history, least)
        return Run(history, result, workdir, time.monotonic() - began)
    finally:
        if monitor is not None:
            monitor.done.set()
        if cluster is not None:
            cluster.close()
        net.close()


def _revive(cluster: Cluster, log: Any) -> list[str]:
    """Start again every service found dead (none should be: the nemeses restart what they
    kill); their names."""
    dead = [name for name, p in cluster.procs.items() if not p.alive]
    for name in dead:
        log(f"  {name} died during the run:\n{tail(cluster.procs[name].log, 1500)}")
        if name.startswith("redis-"):
            cluster.restart_redis(name)
        else:
            cluster.restart(name)
    return dead


def _settle(cluster: Cluster) -> None:
    """Wait until broker-a keeps one primary for two seconds (start-up elections done)."""
    deadline = time.monotonic() + 60
    held, since = None, time.monotonic()
    while time.monotonic() < deadline:
        p = cluster.primary_a()
        if p != held:
            held, since = p, time.monotonic()
        elif p is not None and time.monotonic() - since > 2.0:
            return
        time.sleep(0.2)
    raise TimeoutError("broker-a did not settle on a primary")


def _inject(cluster: Cluster, schedule: list[Nemesis], log: Any) -> list[Fault]:
    faults = []
    time.sleep(WARMUP_S)
    for nemesis in schedule:
        fault = Fault(nemesis.family, nemesis.name, now_ms(), writable=nemesis.writable)
        try:
            fault.note = nemesis.start(cluster)
            time.sleep(nemesis.hold_s)
        finally:
            healed = nemesis.heal(cluster)
            fault.heal_ms = now_ms()
        fault.note += f" / {healed}"
        faults.append(fault)
        log(f"  {nemesis.family:<10} {nemesis.name}: {fault.note}")
        time.sleep(GAP_S)
    return faults


def final_read(cluster: Cluster) -> tuple[list[Stored], dict[str, int]]:
    """Every record of the topic, read from each group's primary (after everything healed,
    once the primary's high-water mark covers its log), and each queue's first stored offset
    (``"group/queue" → offset``)."""
    out: list[Stored] = []
    firsts: dict[str, int] = {}
    for group, name in ((GROUP_A, cluster.wait_primary_a(60)), (GROUP_B, "b0")):
        for q in range(QUEUES):
            records, first = read_queue(cluster, name, group, q)
            out += records
            firsts[f"{group}/{q}"] = first
    return out, firsts


def read_replicas(cluster: Cluster, log: Any) -> dict[str, list[Stored]]:
    """Every member of broker-a read in full, to be compared record by record."""
    out: dict[str, list[Stored]] = {}
    for name in ("a0", "a1", "a2"):
        try:
            out[cluster.procs[name].url] = [
                s for q in range(QUEUES) for s in read_queue(cluster, name, GROUP_A, q)[0]]
        except httpx.HTTPError as exc:
            log(f"  {name} could not be read for the replica comparison: {exc}")
    return out


def read_queue(cluster: Cluster, name: str, group: str, q: int) -> tuple[list[Stored], int]:
    """One queue of one member, from its first stored offset to its end: (records, first
    offset). Every offset is asked for: an answer whose ``next_offset`` jumps past records it
    did not return is asked again from the first one missing (the topic has no tags, so no
    record is legitimately skipped)."""
    url = cluster.procs[name].url
    records: list[Stored] = []
    offset, first, empty = 0, -1, 0
    while True:
        resp = cluster.http.get(f"{url}/v1/topics/{TOPIC}/queues/{q}/messages",
                                params={"offset": offset, "max": 1024, "wait_ms": 0},
                                timeout=10)
        resp.raise_for_status()
        answer = resp.json()
        if first < 0:
            first = int(answer["min_offset"])
        for m in answer["messages"]:
            key, seq = _key_seq(m.get("body", ""))
            records.append(Stored(m["message_id"], TOPIC, group, q, m["queue_offset"], key,
                                  seq, int(m.get("store_timestamp_ms") or 0), url))
        if answer["messages"]:
            offset, empty = answer["messages"][-1]["queue_offset"] + 1, 0
            continue
        if answer["next_offset"] >= answer["max_offset"] or answer["next_offset"] <= offset:
            return records, first
        empty += 1  # an empty answer that moves on: ask again before believing it
        if empty >= FINAL_READ_RETRIES:
            offset, empty = answer["next_offset"], 0


def _key_seq(body: str) -> tuple[str | None, int]:
    try:
        doc = json.loads(body)
    except ValueError:
        return None, 0
    if isinstance(doc, dict) and doc.get("key"):
        return str(doc["key"]), int(doc.get("seq", 0))
    return None, 0
