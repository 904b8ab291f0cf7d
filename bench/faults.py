"""Faults between real hosts: a Jepsen-style run with a history checker.

Run ``python -m bench.faults [--quick] [--json]`` as root (network namespaces).

Hosts are Linux network namespaces on a bridge of their own (bench/_faults/netns.py): broker-a's
three copies on n1-n3, broker-b on n4, etcd and Redis (with Sentinel) on n5/n6, nameservers on
n7 and n4, the workload on c1. While the workload sends (plain and sharding-key messages,
delayed messages of 1-6 s and one in ten up to 90 s, some cancelled, transactions committed,
rolled back and left UNKNOWN; beside the raw client, the SDK — sends, batches, delays, cancels,
transactions — and the official RocketMQ 5 client over gRPC) and consumer groups read (two raw,
a PushConsumer and a SimpleConsumer), the nemeses run one after another, each healed before the
next: every nemesis once with ``--quick`` (13 faults), three rounds without. Then the checker
reads the history (bench/_faults/checker.py) and prints the violations, the timers' lateness and
each fault's unavailability window, with the work it saw (operations per kind, retries,
failovers: a run below the minimums of bench/_faults/run.py is a violation, ``too_little_work``)
and the operations that ended unknown. The exit status is 1 when any violation was found, 2 when
the suite could not run here (not root, tools missing) unless ``--allow-skip`` makes that 0.
``--short`` runs the short schedule of tests/bench/faults (seven faults, one per family).
``--canaries`` runs the short schedule once per deliberate bug of bench/_faults/canaries/, each
on a temporary copy of the tree, and exits 1 unless every one is caught by the check it names.
``--lease-s`` sets broker-a's lease (default: the broker's own, 2 s; a longer one where a loaded
machine makes 2 s lapse by itself). ``--clock-limits`` runs only the clock steps tidemq does not
survive (a primary's and a scheduler's wall clock; docs/reliability.md, "Known limits"): it
shows what they cost.

JSON keys: ``lost``, ``duplicates``, ``unexpected``, ``order_violations``, ``aborted_read``,
``early_timers``, ``late_p99_ms``, ``split_brain_acks``, ``unavailable_s_max``,
``unavailable_writable_s_max`` (the same over the faults some side could write through),
``recovery_s_max`` (over the faults no side could write through — marked ``*`` in the table:
a 1|2 split with etcd beside the lone primary, the client cut from a group, a full disk — the
worst gap's part after the heal; ``recovery_s`` per fault), ``late_writable_p99_ms`` (the
timers not due while such a fault lasted),
``faults_injected``, ``skipped_by_group``, ``unverifiable``, ``offsets_forward``,
``replica_divergence``, ``too_little_work``, ``work``, ``unknown``, ``unknown_never_read``,
``app_errors``, ``app_wait_s_max``, ``failover_s_p50``, ``failover_s_max`` (seconds from a
fault that brought broker-a a new primary to its first acknowledgement; ``failover_s`` per
fault) (and the other checks and measures of the checker); with
``--canaries``: ``canaries``, ``caught``, ``missed``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from bench._common import err, print_json
from bench._faults.canary import load, run_one
from bench._faults.canary import table as canary_table
from bench._faults.checker import table
from bench._faults.history import dump
from bench._faults.nemesis import clock_limits, long_schedule, short_schedule
from bench._faults.netns import available
from bench._faults.run import GRPC_MINIMUMS, MINIMUMS, SDK_MINIMUMS, run

LONG_DELAY_MS = 90_000  # one delayed message in ten waits up to this long (1.5 minutes)
SKIPPED = 2  # the exit status of a run that could not start here
# the quick schedule (13 faults) does about twice the short one's work
SHORT_MINIMUMS = {**MINIMUMS, **SDK_MINIMUMS, **GRPC_MINIMUMS}
QUICK_MINIMUMS = {k: 2 * v for k, v in SHORT_MINIMUMS.items()}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--clock-limits", action="store_true",
                    help="step the clocks of a primary and a scheduler (known limits)")
    ap.add_argument("--short", action="store_true",
                    help="the short schedule (one fault per family)")
    ap.add_argument("--canaries", action="store_true",
                    help="run the short schedule under each deliberate bug; all must be caught")
    ap.add_argument("--allow-skip", action="store_true",
                    help="exit 0 when the suite cannot run here (not root, tools missing)")
    ap.add_argument("--lease-s", type=float, default=None,
                    help="broker-a's lease in seconds (default: the broker's own, 2 s); a "
                         "longer one on a loaded machine, where 2 s lapses by itself")
    ap.add_argument("--keep", type=Path, default=None,
                    help="keep the run's directory (logs, history) here: a new or empty one")
    args = ap.parse_args(argv)
    why = available()
    if why is not None:
        err.print(f"faults: skipped: {why}")
        if args.json:
            print_json({"skipped": why})
        return 0 if args.allow_skip else SKIPPED
    if args.canaries:
        return canaries(args.json)
    if args.keep is not None and args.keep.exists() and any(args.keep.iterdir()):
        # the services would start on the old run's data, the history would mix both runs
        ap.error(f"--keep {args.keep}: the directory is not empty (an earlier run's?); "
                 "give a new or an empty one")
    schedule = (clock_limits() if args.clock_limits else short_schedule() if args.short
                else long_schedule(1 if args.quick else 3))
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="tidemq-faults-"))
    try:
        done = run(schedule, workdir, long_delay_max_ms=0 if args.short else LONG_DELAY_MS,
                   log=err.print, minimums=SHORT_MINIMUMS if args.short else QUICK_MINIMUMS,
                   lease_s=args.lease_s)
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


def canaries(as_json: bool) -> int:
    found = load()
    err.print(f"faults: {len(found)} canaries, one short schedule each")
    outcomes = [run_one(c, err.print) for c in found]
    print(canary_table(outcomes))
    if as_json:
        print_json({"canaries": len(outcomes), "caught": sum(o.caught for o in outcomes),
                    "missed": [o.canary.name for o in outcomes if not o.caught]})
    return 0 if outcomes and all(o.caught for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
