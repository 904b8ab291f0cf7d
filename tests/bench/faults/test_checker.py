"""The faults checker over hand-made histories: a clean history passes, and each kind of
violation is found (and only that kind)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench._faults.checker import VIOLATIONS, check, table
from bench._faults.history import (
    FAIL,
    INFO,
    OK,
    Fault,
    History,
    Op,
    RoleSample,
    Stored,
    dump,
    load,
)

T = "Orders"
END = 100_000


def send(mid: str, t: int, *, key: str | None = None, seq: int = 0, kind: str = OK,
         address: str = "http://a0", group: str = "broker-a") -> Op:
    return Op("send", kind, t, t + 5, id=mid, topic=T, key=key, seq=seq, group=group,
              address=address)


def stored(mid: str, offset: int, *, key: str | None = None, seq: int = 0, queue: int = 0,
           group: str = "broker-a") -> Stored:
    return Stored(mid, T, group, queue, offset, key, seq)


def read(mid: str, t: int, cgroup: str = "cg1") -> Op:
    return Op("read", OK, t, t, id=mid, topic=T, cgroup=cgroup)


def clean() -> History:
    """Every promise kept: sends (two of one key, in order), a committed and a rolled-back
    transaction, a timer delivered after its due time, a cancelled one never delivered,
    offsets committed and read back, one fault."""
    ops = [send("m1", 1000, key="k", seq=1), send("m2", 2000, key="k", seq=2),
           send("m3", 3000, kind=INFO), send("m4", 3500, kind=FAIL),
           Op("txn", OK, 4000, 4010, id="t1", topic=T, intent="commit", end="commit"),
           Op("txn", OK, 4100, 4110, id="t2", topic=T, intent="rollback", end="unknown"),
           Op("delay", OK, 5000, 5010, id="d1", topic=T, due_ms=8000),
           Op("delay", OK, 5000, 5010, id="d2", topic=T, due_ms=60_000),
           Op("cancel", OK, 6000, 6010, id="d2"),
           read("m1", 1100), read("m2", 2100), read("t1", 4500), read("d1", 8200),
           read("d1", 8300, "cg2"),
           Op("commit_offset", OK, 9000, 9010, cgroup="cg1", group="broker-a", topic=T,
              queue=0, offset=4),
           Op("fetch_offset", OK, 9500, 9510, cgroup="cg1", group="broker-a", topic=T,
              queue=0, offset=4)]
    final = [stored("m1", 0, key="k", seq=1), stored("m2", 1, key="k", seq=2),
             stored("t1", 2), stored("d1", 3)]
    roles = [RoleSample(500, "broker-a", "http://a0", "primary", 1)]
    faults = [Fault("kill", "kill primary", 2500, 3200)]
    return History(ops, roles, faults, final, END)


def only(h: History, kind: str, n: int = 1) -> None:
    r = check(h)
    assert r.counts[kind] == n, (kind, r.counts, dict(r.examples))
    assert all(c == 0 for k, c in r.counts.items() if k != kind), r.counts
    assert not r.ok


def test_a_clean_history_passes() -> None:
    h = clean()
    r = check(h)
    assert r.ok, (r.counts, dict(r.examples))
    assert r.acked == 6 and r.reads == 5 and r.faults == 1
    assert r.late_ms == [200]
    out = r.to_json()
    assert set(VIOLATIONS) <= set(out)
    assert out["late_p99_ms"] == 200 and out["faults_injected"] == 1
    assert "1. kill primary" in table(r, h)


def test_an_acknowledged_send_never_readable_is_lost() -> None:
    h = clean()
    h.final = [s for s in h.final if s.id != "m1"]
    assert check(h).ok  # read by a consumer, then gone (retention): delivered, not lost
    h.ops = [op for op in h.ops if not (op.f == "read" and op.id == "m1")]
    only(h, "lost")


def test_a_committed_transaction_never_visible_is_lost() -> None:
    h = clean()
    h.final = [s for s in h.final if s.id != "t1"]
    h.ops = [op for op in h.ops if op.id != "t1" or op.f != "read"]
    only(h, "lost")


def test_a_timer_never_delivered_is_lost_but_not_one_due_near_the_end() -> None:
    h = clean()
    h.ops.append(Op("delay", OK, 5000, 5010, id="d3", topic=T, due_ms=20_000))
    h.ops.append(Op("delay", OK, 5000, 5010, id="d4", topic=T, due_ms=END - 1000))
    only(h, "lost")


def test_a_message_stored_twice_is_a_duplicate() -> None:
    h = clean()
    h.final.append(stored("m1", 7, key="k", seq=1, queue=3))
    only(h, "duplicates")


def test_a_message_read_but_never_sent_or_sent_with_a_failure_is_unexpected() -> None:
    h = clean()
    h.ops.append(read("ghost", 5000))
    h.final.append(stored("m4", 9))  # its send failed with a 4xx
    only(h, "unexpected", 2)


def test_a_sharding_key_stored_out_of_send_order() -> None:
    h = clean()
    h.final[0], h.final[1] = stored("m1", 1, key="k", seq=1), stored("m2", 0, key="k", seq=2)
    only(h, "order_violations")


def test_a_rolled_back_transaction_that_is_visible() -> None:
    h = clean()
    h.ops.append(read("t2", 7000, "cg2"))
    only(h, "aborted_read")


def test_a_timer_read_before_its_due_time_is_early() -> None:
    h = clean()
    h.ops.append(read("d1", 7999, "cg2"))
    only(h, "early_timers")


def test_a_cancelled_timer_delivered_anyway() -> None:
    h = clean()
    h.ops.append(read("d2", 61_000))
    only(h, "after_cancel")


def test_an_ack_from_a_deposed_primary_is_split_brain() -> None:
    h = clean()
    h.roles.append(RoleSample(1500, "broker-a", "http://a1", "primary", 2))
    # m2 was sent at 2000 to a0, still at epoch 1, after a1 became primary under epoch 2
    only(h, "split_brain_acks")
    # the same ack from a0 after it was promoted again (epoch 3) is fine, also when the
    # controller saw the promotion only a moment after the acknowledgement
    h.roles.append(RoleSample(3000, "broker-a", "http://a0", "primary", 3))
    assert check(h).ok


def test_a_committed_offset_read_back_lower_went_backwards() -> None:
    h = clean()
    h.ops.append(Op("fetch_offset", OK, 9600, 9610, cgroup="cg1", group="broker-a", topic=T,
                    queue=0, offset=2))
    only(h, "offsets_backwards")


def test_unavailability_is_the_longest_gap_in_acks_during_a_fault() -> None:
    h = clean()
    steady = [10_000, *range(20_000, END, 1000)]  # one ack a second, but none for 10 s
    h.ops += [send(f"u{t}", t) for t in steady]
    h.final += [stored(f"u{t}", 5 + i) for i, t in enumerate(steady)]
    h.faults.append(Fault("partition", "primary cut from etcd", 11_000, 14_000))
    r = check(h)
    assert r.ok
    # from the fault's start to the next ack (20 005 ms)
    assert r.unavailable_s["2. primary cut from etcd"] == pytest.approx(9.005)
    # after the last send began, silence is not unavailability (the workload stopped)
    h.faults.append(Fault("link", "lossy link", END - 2000, END - 1000))
    assert check(h).unavailable_s["3. lossy link"] < 2.0


def test_a_service_that_died_by_itself_is_a_crash() -> None:
    h = clean()
    h.crashed = ["b0"]
    only(h, "crashes")


def test_the_history_round_trips_through_a_file(tmp_path: Path) -> None:
    h = clean()
    dump(h, tmp_path / "history.json")
    again = load(tmp_path / "history.json")
    assert check(again).to_json() == check(h).to_json()
    assert json.loads(h.ops[0].to_json())["id"] == "m1"
