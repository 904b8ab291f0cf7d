"""Faults between real hosts: a Jepsen-style run with a history checker.

Run ``python -m bench.faults [--quick] [--json]`` as root (network namespaces).

Hosts are Linux network namespaces on a bridge of their own (bench/_faults/netns.py): broker-a's
three copies on n1-n3, broker-b on n4, etcd and Redis (with Sentinel) on n5/n6, nameservers on
n7 and n4, the workload on c1. While the workload sends (plain and sharding-key messages, delayed
messages of 1-6 s and one in ten up to 90 s, some cancelled, transactions committed, rolled back
and left UNKNOWN) and two consumer
groups read, the nemeses run one after another, each healed before the next: every nemesis once
with ``--quick`` (13 faults), three rounds without. Then the checker reads the history
(bench/_faults/checker.py) and prints the violations, the timers' lateness and each fault's
unavailability window. The exit status is 1 when any violation was found.
``--clock-limits`` runs only the clock steps tidemq does not survive (a primary's and a
scheduler's wall clock; docs/reliability.md, "Known limits"): it shows what they cost.

JSON keys: ``lost``, ``duplicates``, ``unexpected``, ``order_violations``, ``aborted_read``,
``early_timers``, ``late_p99_ms``, ``split_brain_acks``, ``unavailable_s_max``,
``faults_injected`` (and the other checks and measures of the checker).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from bench._common import err, print_json
from bench._faults.checker import table
from bench._faults.history import dump
from bench._faults.nemesis import clock_limits, long_schedule
from bench._faults.netns import available
from bench._faults.run import run

LONG_DELAY_MS = 90_000  # one delayed message in ten waits up to this long (1.5 minutes)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--clock-limits", action="store_true",
                    help="step the clocks of a primary and a scheduler (known limits)")
    ap.add_argument("--keep", type=Path, default=None,
                    help="keep the run's directory (logs, history) here")
    args = ap.parse_args(argv)
    why = available()
    if why is not None:
        err.print(f"faults: skipped: {why}")
        if args.json:
            print_json({"skipped": why})
        return 0
    schedule = clock_limits() if args.clock_limits else long_schedule(1 if args.quick else 3)
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="tidemq-faults-"))
    try:
        done = run(schedule, workdir, long_delay_max_ms=LONG_DELAY_MS, log=err.print)
    finally:
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.keep is not None:
        dump(done.history, args.keep / "history.json")
    print(f"faults: {len(schedule)} faults in {done.seconds:.0f} s")
    print(table(done.result, done.history))
    for kind, examples in done.result.examples.items():
        for example in examples:
            print(f"  {kind}: {example}")
    if args.json:
        print_json(done.result.to_json())
    return 0 if done.result.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
