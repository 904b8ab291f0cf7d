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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench._faults.checker import Result, check
from bench._faults.cluster import GROUP_A, GROUP_B, HOSTS, Cluster, tail
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
from bench._faults.workload import Config

TOPIC = "FaultsT"
QUEUES = 4
WARMUP_S = 3.0  # the workload runs this long before the first fault
GAP_S = 3.0  # after a fault is healed, before the next one
DRAIN_S = 12.0  # after the last operation: timers come due, checks resolve, consumers read


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


def run(schedule: list[Nemesis], workdir: Path, *, writers: int = 6,
        long_delay_max_ms: int = 0, log: Any = print) -> Run:
    """``long_delay_max_ms``: one delayed message in ten waits up to this long (0: none; the
    drain does not wait for them, the checker judges those due before the end)."""
    began = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    net = Network(HOSTS)
    cluster: Cluster | None = None
    monitor: Monitor | None = None
    try:
        net.up()
        cluster = Cluster(net, workdir).start()
        _settle(cluster)
        cluster.create_topic(TOPIC, QUEUES)
        log(f"cluster up in {time.monotonic() - began:.0f} s; primary of broker-a: "
            f"{cluster.primary_a()}")
        monitor = Monitor(cluster)
        monitor.start()
        length = 60.0 * (len(schedule) + 1)  # at most: the controller stops it (stop file)
        history_path = workdir / "history.jsonl"
        stop = workdir / "stop"
        cfg = Config(nameservers=cluster.nameservers, groups=[GROUP_A, GROUP_B], topic=TOPIC,
                     out=str(history_path), duration_s=length, drain_s=DRAIN_S,
                     writers=writers, stop_file=str(stop),
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
        crashed = _revive(cluster, log)
        history = History(read_ops(history_path), monitor.samples, faults, [], end, crashed)
        dump(history, workdir / "history.json")  # kept for a look whatever follows
        if code != 0:
            raise RuntimeError(f"the workload failed ({code}):\n{tail(workdir / 'workload.log')}")
        history.final = final_read(cluster)
        dump(history, workdir / "history.json")
        result = check(history)
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
        fault = Fault(nemesis.family, nemesis.name, now_ms())
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


def final_read(cluster: Cluster) -> list[Stored]:
    """Every record of the topic, read from each group's primary (after everything healed,
    once the primary's high-water mark covers its log)."""
    out: list[Stored] = []
    for group, name in ((GROUP_A, cluster.wait_primary_a(60)), (GROUP_B, "b0")):
        url = cluster.procs[name].url
        for q in range(QUEUES):
            offset = 0
            while True:
                resp = cluster.http.get(f"{url}/v1/topics/{TOPIC}/queues/{q}/messages",
                                        params={"offset": offset, "max": 1024, "wait_ms": 0},
                                        timeout=10)
                resp.raise_for_status()
                answer = resp.json()
                for m in answer["messages"]:
                    key, seq = _key_seq(m.get("body", ""))
                    out.append(Stored(m["message_id"], TOPIC, group, q, m["queue_offset"],
                                      key, seq))
                done = not answer["messages"] and answer["next_offset"] >= answer["max_offset"]
                if done or answer["next_offset"] <= offset:
                    break
                offset = answer["next_offset"]
    return out


def _key_seq(body: str) -> tuple[str | None, int]:
    try:
        doc = json.loads(body)
    except ValueError:
        return None, 0
    if isinstance(doc, dict) and doc.get("key"):
        return str(doc["key"]), int(doc.get("seq", 0))
    return None, 0
