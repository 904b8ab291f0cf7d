"""The faults checker over hand-made histories: a clean history passes, and each kind of
violation is found (and only that kind)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from bench._faults.checker import VIOLATIONS, check, table
from bench._faults.etcdwatch import PRIMARY_KEY, announcement
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
from tidemq_server.broker.replication.election import GroupKeys

T = "Orders"
END = 100_000


def send(mid: str, t: int, *, key: str | None = None, seq: int = 0, kind: str = OK,
         address: str = "http://a0", group: str = "broker-a") -> Op:
    return Op("send", kind, t, t + 5, id=mid, topic=T, key=key, seq=seq, group=group,
              address=address)


def stored(mid: str, offset: int, *, key: str | None = None, seq: int = 0, queue: int = 0,
           group: str = "broker-a") -> Stored:
    return Stored(mid, T, group, queue, offset, key, seq)


def read(mid: str, t: int, cgroup: str = "cg1", *, offset: int = -1, queue: int = 0,
         store_ms: int = 0) -> Op:
    return Op("read", OK, t, t, id=mid, topic=T, cgroup=cgroup, group="broker-a", queue=queue,
              offset=offset, store_ms=store_ms)


def clean() -> History:
    """Every promise kept: sends (two of one key, in order), a committed and a rolled-back
    transaction, a timer delivered after its due time, a cancelled one never delivered,
    everything read by both consumer groups, offsets committed and read back, one fault."""
    ops = [send("m1", 1000, key="k", seq=1), send("m2", 2000, key="k", seq=2),
           send("m3", 3000, kind=INFO), send("m4", 3500, kind=FAIL),
           Op("txn", OK, 4000, 4010, id="t1", topic=T, intent="commit", end="commit"),
           Op("txn", OK, 4100, 4110, id="t2", topic=T, intent="rollback", end="unknown"),
           Op("delay", OK, 5000, 5010, id="d1", topic=T, due_ms=8000, deliver_at_ms=8000),
           Op("delay", OK, 5000, 5010, id="d2", topic=T, due_ms=60_000),
           Op("cancel", OK, 6000, 6010, id="d2"),
           Op("commit_offset", OK, 9000, 9010, cgroup="cg1", group="broker-a", topic=T,
              queue=0, offset=4),
           Op("fetch_offset", OK, 9500, 9510, cgroup="cg1", group="broker-a", topic=T,
              queue=0, offset=4)]
    for cg, lag in (("cg1", 100), ("cg2", 200)):
        ops += [read("m1", 1100 + lag, cg, offset=0), read("m2", 2100 + lag, cg, offset=1),
                read("t1", 4500 + lag, cg, offset=2),
                read("d1", 8100 + lag, cg, offset=3, store_ms=8100)]
    final = [stored("m1", 0, key="k", seq=1), stored("m2", 1, key="k", seq=2),
             stored("t1", 2), Stored("d1", T, "broker-a", 0, 3, store_ms=8100)]
    roles = [RoleSample(500, "broker-a", "http://a0", "primary", 1)]
    faults = [Fault("kill", "kill primary", 2500, 3200)]
    return History(ops, roles, faults, final, END, cgroups=["cg1", "cg2"])


def only(h: History, kind: str, n: int = 1) -> None:
    r = check(h)
    assert r.counts[kind] == n, (kind, r.counts, dict(r.examples))
    assert all(c == 0 for k, c in r.counts.items() if k != kind), r.counts
    assert not r.ok


def test_a_clean_history_passes() -> None:
    h = clean()
    r = check(h)
    assert r.ok, (r.counts, dict(r.examples))
    assert r.acked == 6 and r.reads == 8 and r.faults == 1
    assert r.late_ms == [100]  # the delivered copy's store time (broker's clock) minus due
    out = r.to_json()
    assert set(VIOLATIONS) <= set(out)
    assert out["late_p99_ms"] == 100 and out["faults_injected"] == 1
    assert "1. kill primary" in table(r, h)


def test_an_acknowledged_send_never_readable_is_lost() -> None:
    h = clean()
    h.ops = [op for op in h.ops if not (op.f == "read" and op.id == "m1")]
    h.final = [s for s in h.final if s.id != "m1"]
    only(h, "lost")


def test_a_message_read_then_gone_is_lost_unless_below_the_first_stored_offset() -> None:
    h = clean()
    h.final = [s for s in h.final if s.id != "m1"]
    only(h, "lost")  # read by both groups, then gone although the topic keeps everything
    h.min_offsets = {"broker-a/0": 1}  # retention deleted offset 0: nothing can be said
    only(h, "unverifiable")


def test_a_message_one_group_never_read_is_skipped_by_that_group() -> None:
    h = clean()
    h.ops = [op for op in h.ops if not (op.f == "read" and op.id == "m2" and op.cgroup == "cg2")]
    only(h, "skipped_by_group")
    assert "cg2" in check(h).examples["skipped_by_group"][0]
    # a timer delivered to one group only is skipped too
    h = clean()
    h.ops = [op for op in h.ops if not (op.f == "read" and op.id == "d1" and op.cgroup == "cg1")]
    only(h, "skipped_by_group")


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
    h.ops.append(read("m1", 9000, offset=7, queue=3))
    only(h, "duplicates")  # the copies in the final read, counted once


def test_two_copies_the_sdk_announced_as_possible_are_counted_not_flagged() -> None:
    h = clean()
    h.ops.append(Op("send", OK, 2600, 3600, id="p1", topic=T, client="sdk", group="broker-b",
                    possible_dup=True))
    h.final += [stored("p1", 4), stored("p1", 0, group="broker-b")]
    h.ops += [read("p1", 3700, cg, offset=4) for cg in ("cg1", "cg2")]
    r = check(h)
    assert r.ok and r.sdk_possible_duplicates == 1, r.counts
    h.ops[-3] = Op("send", OK, 2600, 3600, id="p1", topic=T, client="sdk", group="broker-b")
    only(h, "duplicates")  # the SDK did not say so: a duplicate


def test_a_message_one_group_read_at_two_positions_is_a_duplicate() -> None:
    h = clean()
    h.ops.append(read("m1", 9000, "cg2", offset=7, queue=3))  # the copy at 3/7 is gone since
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
    h.ops.append(read("d1", 7999, "cg2", offset=3))
    only(h, "early_timers")


def test_a_timer_stored_before_its_due_time_is_early_even_when_read_late() -> None:
    h = clean()  # consumers read d1 after 8000, but the broker stored the copy at 7500
    h.ops = [Op(**{**op.__dict__, "store_ms": 7500}) if op.id == "d1" and op.f == "read"
             else op for op in h.ops]
    only(h, "early_timers")


def test_the_due_time_is_the_one_the_broker_answered() -> None:
    h = clean()  # asked for 8000 (delay_ms from the client's clock); the broker said 8500
    h.ops = [Op(**{**op.__dict__, "deliver_at_ms": 8500}) if op.id == "d1" and op.f == "delay"
             else op for op in h.ops]
    only(h, "early_timers")


def test_a_cancel_answered_already_delivered_before_the_due_time_is_early() -> None:
    h = clean()
    h.ops.append(Op("delay", OK, 5000, 5010, id="d3", topic=T, due_ms=95_000,
                    deliver_at_ms=95_000))
    h.ops.append(Op("cancel", FAIL, 6000, 6010, id="d3",
                    error="409 ALREADY_DELIVERED from http://a0"))
    only(h, "early_timers")


def test_timers_late_outside_fault_windows() -> None:
    h = clean()
    late = [Op("delay", OK, 30_000 + i, 30_010 + i, id=f"l{i}", topic=T, due_ms=40_000 + i)
            for i in range(10)]
    h.ops += late
    for i, op in enumerate(late):
        h.final.append(Stored(op.id, T, "broker-a", 1, i, store_ms=op.due_ms + 6000))
        h.ops += [read(op.id, op.due_ms + 6100, cg, offset=i, queue=1,
                       store_ms=op.due_ms + 6000) for cg in ("cg1", "cg2")]
    only(h, "late_timers")
    assert check(h).to_json()["late_calm_p99_ms"] == 6000
    h.faults.append(Fault("partition", "scheduler cut off", 39_000, 41_000))
    assert check(h).ok  # late while a fault lasted (or just after it): measured, not judged
    assert check(h).to_json()["late_writable_p99_ms"] == 6000  # a side could write through it
    h.faults[-1].writable = False  # no side could: these timers are set apart
    assert check(h).to_json()["late_writable_p99_ms"] < 6000


def test_a_cancelled_timer_delivered_anyway() -> None:
    h = clean()
    h.ops.append(read("d2", 61_000))
    only(h, "after_cancel")


def test_a_cancelled_timer_found_in_the_final_read() -> None:
    h = clean()
    h.final.append(Stored("d2", T, "broker-a", 2, 0, store_ms=60_000))
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


def test_a_committed_offset_read_back_higher_than_any_commit_jumped_forward() -> None:
    h = clean()
    h.ops.append(Op("fetch_offset", OK, 9600, 9610, cgroup="cg1", group="broker-a", topic=T,
                    queue=0, offset=5))
    only(h, "offsets_forward")
    # an unknown commit may have landed: reading it back is fine
    h.ops.append(Op("commit_offset", INFO, 9550, 9590, cgroup="cg1", group="broker-a",
                    topic=T, queue=0, offset=5))
    assert check(h).ok


def test_replicas_holding_different_records_diverge() -> None:
    h = clean()
    h.replicas = {"http://a0": list(h.final), "http://a1": list(h.final[:2])}
    assert check(h).ok  # a shorter member is catching up
    h.replicas["http://a2"] = [*h.final[:1], stored("t1", 1)]
    only(h, "replica_divergence")


def test_a_member_lacking_a_record_inside_what_it_holds_has_a_hole() -> None:
    """Seen in faults runs of main: a member restarted after SIGKILL held a zero-size consume
    queue unit (never served) where the others held an acknowledged message; once it led, the
    final read (and every consumer) skipped it. Not a member catching up: its range goes on."""
    h = clean()
    h.replicas = {"http://a0": list(h.final), "http://a1": [h.final[0], *h.final[2:]]}
    only(h, "replica_divergence")
    assert "http://a1 has a hole" in check(h).examples["replica_divergence"][0]


def test_unknown_operations_and_the_work_done_are_counted() -> None:
    h = clean()
    h.ops.append(Op("send", OK, 7000, 7300, id="m5", topic=T, attempts=3))
    h.final.append(stored("m5", 4))
    h.ops += [read("m5", 7400, cg, offset=4) for cg in ("cg1", "cg2")]
    h.roles.append(RoleSample(7100, "broker-a", "http://a1", "primary", 2))
    r = check(h)
    assert r.ok, r.counts
    assert r.unknown == {"send": 1} and r.unknown_never_read == 1  # m3: fine, but reported
    assert r.work["send"] == 3 and r.work["retries"] == 1 and r.work["failovers"] == 1
    assert "ended unknown: send 1" in table(r, h)
    least = {"send": 3, "retries": 1, "failovers": 1, "cancel": 1}
    assert check(h, least).ok
    r = check(h, {**least, "failovers": 2, "txn": 5})
    assert r.counts["too_little_work"] == 2 and not r.ok


def test_what_the_sdk_application_saw_is_counted_per_fault() -> None:
    h = clean()
    h.ops += [Op("send", INFO, 2600, 9600, id="p1", topic=T, client="sdk"),
              Op("send", OK, 2700, 2900, id="p2", topic=T, client="sdk", group="broker-a")]
    h.final.append(stored("p2", 4))
    h.ops += [read("p2", 3000, cg, offset=4) for cg in ("cg1", "cg2")]
    r = check(h)
    assert r.ok, r.counts
    assert r.app_errors == 1 and r.to_json()["app_wait_s_max"] == 7.0
    assert r.app_wait_s == {"1. kill primary": 7.0}
    # a cancel answered "already delivered" after the due time is the contract's outcome,
    # counted apart; a raised error that is not that one counts
    h.ops += [Op("delay", OK, 2600, 2610, id="q1", topic=T, due_ms=3000, deliver_at_ms=3000,
                 client="sdk"),
              Op("cancel", FAIL, 2800, 3100, id="q1", client="sdk",
                 error="409 ALREADY_DELIVERED (too late to cancel)"),
              Op("cancel", INFO, 2800, 3100, id="q2", client="sdk",
                 error="ClientClosedError('the client is closed')")]
    h.ops += [read("q1", 3050, cg, offset=5, store_ms=3040) for cg in ("cg1", "cg2")]
    h.final.append(Stored("q1", T, "broker-a", 0, 5, store_ms=3040))
    r = check(h)
    assert r.ok, r.counts
    assert r.app_errors == 2 and r.app_cancels_too_late == 1


def test_unavailability_is_the_longest_gap_in_acks_during_a_fault() -> None:
    h = clean()
    steady = [10_000, *range(20_000, END, 1000)]  # one ack a second, but none for 10 s
    h.ops += [send(f"u{t}", t) for t in steady]
    h.final += [stored(f"u{t}", 5 + i) for i, t in enumerate(steady)]
    h.ops += [read(f"u{t}", t + 10, cg, offset=5 + i) for i, t in enumerate(steady)
              for cg in ("cg1", "cg2")]
    # a send asked of the group before the fault, unanswered (ended unknown) through it
    h.ops.append(Op("send", INFO, 10_500, 19_000, id="w1", topic=T, group="broker-a"))
    h.faults.append(Fault("partition", "primary cut from etcd", 11_000, 14_000))
    r = check(h)
    assert r.ok
    # from the fault's start to the next ack (20 005 ms)
    assert r.unavailable_s["2. primary cut from etcd"] == pytest.approx(9.005)
    # after the last send began, silence is not unavailability (the workload stopped)
    h.faults.append(Fault("link", "lossy link", END - 2000, END - 1000))
    assert check(h).unavailable_s["3. lossy link"] < 2.0
    out = check(h).to_json()
    assert out["unavailable_writable_s_max"] == out["unavailable_s_max"] >= 9.0
    assert out["recovery_s"] == {}
    # a fault no side could write through: the same gap, and its part past the heal apart
    h.faults[-2].writable = False
    r = check(h)
    out = r.to_json()
    assert r.unavailable_s["2. primary cut from etcd"] == pytest.approx(9.005)
    assert out["unavailable_writable_s_max"] == round(max(
        s for name, s in r.unavailable_s.items() if not name.startswith("2.")), 1)
    assert out["recovery_s"] == {"2. primary cut from etcd": pytest.approx(6.005)}


def test_a_group_asked_nothing_is_not_unavailable_and_a_gap_is_its_own_faults() -> None:
    """The writers all wait on broker-a: broker-b, asked nothing meanwhile, is silent but not
    unavailable; it is from the first send asked of it. A long gap of a later fault is not
    charged to an earlier one whose recovery window reaches it."""
    h = clean()
    steady = [10_000, *range(20_000, 40_000, 1000)]
    h.ops += [send(f"b{t}", t, group="broker-b", address="http://b0") for t in steady]
    h.final += [stored(f"b{t}", i, group="broker-b") for i, t in enumerate(steady)]
    h.ops += [read(f"b{t}", t + 10, cg, offset=i) for i, t in enumerate(steady)
              for cg in ("cg1", "cg2")]
    h.faults += [Fault("partition", "broker-a cut", 11_000, 14_000)]
    assert check(h).unavailable_s["2. broker-a cut"] < 0.1  # nobody asked broker-b
    # a send asked of broker-b at 16 s, answered with the one at 20 s: 4 s unavailable
    h.ops.append(Op("send", INFO, 16_000, 19_000, id="w2", topic=T, group="broker-b"))
    assert check(h).unavailable_s["2. broker-a cut"] == pytest.approx(4.005)
    # a later fault's own silence (asked from 31.5 s, acknowledged 35 s) is charged to it only
    h.ops = [op for op in h.ops if op.id not in {f"b{t}" for t in range(31_000, 35_000, 1000)}]
    h.ops.append(Op("send", INFO, 30_500, 34_000, id="w3", topic=T, group="broker-b"))
    h.faults += [Fault("process", "broker-b paused", 30_500, 33_000)]
    r = check(h)
    assert r.unavailable_s["3. broker-b paused"] == pytest.approx(4.505)
    assert r.unavailable_s["2. broker-a cut"] == pytest.approx(4.005)


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


def test_an_etcd_announcement_is_a_primary_sample_the_split_brain_check_uses() -> None:
    assert PRIMARY_KEY.format(cluster="C", group="g") == GroupKeys("C", "g").primary
    claim = {"broker_id": 1, "address": "http://a1", "epoch": 2, "last_offset": 7}
    value = base64.b64encode(json.dumps(claim).encode()).decode()
    sample = announcement({"kv": {"value": value, "mod_revision": "9"}}, "broker-a")
    assert sample is not None
    assert (sample.address, sample.role, sample.epoch) == ("http://a1", "primary", 2)
    assert announcement({"type": "DELETE", "kv": {}}, "broker-a") is None
    h = clean()
    h.roles.append(RoleSample(1500, "broker-a", sample.address, "primary", sample.epoch))
    only(h, "split_brain_acks")  # m2, sent at 2000 to a0 (epoch 1)


def test_a_failover_lasts_from_the_fault_to_the_new_primarys_first_ack() -> None:
    h = clean()
    # broker-a's primary a0 (epoch 1) is killed at 11 000; a1 is announced under epoch 2 at
    # 13 500 and acknowledges from 14 200; a0 acknowledged once more at 11 100 (before its fence
    # shut) and a1 once at 13 000, while still a replica (a refused write would not be ok; a
    # made-up ack before its promotion must not end the failover)
    h.ops += [send("f0", 11_100), send("f1", 13_000, address="http://a1"),
              send("f2", 14_200, address="http://a1"), send("f3", 15_000, address="http://a1")]
    h.final += [stored(f"f{i}", 5 + i) for i in range(4)]
    h.ops += [read(f"f{i}", 16_000, cg, offset=5 + i) for i in range(4)
              for cg in ("cg1", "cg2")]
    h.roles.append(RoleSample(13_500, "broker-a", "http://a1", "primary", 2))
    h.faults.append(Fault("process", "kill broker-a's primary", 11_000, 12_000))
    h.faults.append(Fault("link", "lossy link", 40_000, 45_000))  # no new primary: no figure
    r = check(h)
    assert r.ok, (r.counts, dict(r.examples))
    assert r.failover_s == {"2. kill broker-a's primary": pytest.approx(3.205)}
    assert r.to_json()["failover_s_max"] == 3.2 and r.to_json()["failover_s_p50"] == 3.2
    assert "failovers p50/max 3.2/3.2 s" in table(r, h)
