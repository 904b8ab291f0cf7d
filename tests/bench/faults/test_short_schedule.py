"""The short faults schedule between namespace hosts (one nemesis of each family: a killed
primary, a primary cut from etcd and its replicas, a lossy link, a full disk, damaged files on
a stopped replica, a wall clock stepped forward and back, the Redis master killed under
Sentinel): the checker finds no violation in the history, and the run did the minimum work
(``run.MINIMUMS``). Needs root (network namespaces)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from bench._faults.checker import table
from bench._faults.nemesis import short_schedule
from bench._faults.netns import available
from bench._faults.run import run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900),
              pytest.mark.skipif(available() is not None,
                                 reason=f"faults between hosts: {available()}")]


def test_the_short_schedule_keeps_every_promise(tmp_path: Path) -> None:
    schedule = short_schedule()
    # with the SDK share (its writers, its transactions, its push and simple consumer groups)
    done = run(schedule, tmp_path / "faults")
    keep = os.environ.get("TIDEMQ_FAULTS_KEEP")  # a failed run's logs and history, kept there
    if keep and not done.result.ok:  # (pytest's own temporary directories are rotated away)
        shutil.copytree(done.workdir, Path(keep) / tmp_path.name, dirs_exist_ok=True)
    report = table(done.result, done.history)
    examples = "\n".join(f"{kind}: {e}" for kind, ex in done.result.examples.items()
                         for e in ex)
    assert done.result.ok, f"{report}\n{examples}\n(logs and history in {done.workdir})"
    assert done.result.faults == len(schedule) == 7
    assert {f.family for f in done.history.faults} == {
        "process", "partition", "link", "disk", "files", "clock", "redis"}
    # the workload did work through the faults: sends, timers and transactions acknowledged
    # and read back by both consumer groups
    kinds = {(op.f, op.type) for op in done.history.ops}
    assert {("send", "ok"), ("delay", "ok"), ("txn", "ok"), ("read", "ok"),
            ("commit_offset", "ok")} <= kinds
    assert {op.cgroup for op in done.history.ops if op.f == "read"} == {
        "cg1", "cg2", "cg-push", "cg-simple"}
    assert {("send", "ok"), ("txn", "ok")} <= {(op.f, op.type) for op in done.history.ops
                                               if op.client == "sdk"}
    assert done.result.acked > 100 and done.result.late_ms
    # the final read covered every queue and every broker-a member
    assert len(done.history.min_offsets) == 8 and len(done.history.replicas) == 3
