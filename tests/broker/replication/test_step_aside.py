"""CheckQuorum's decision (replication/aside.py) as units: a real ``Quorum`` on a fake clock fed
replica fetches, and member claims as etcd would list them (mod revision, claim). The primary
steps aside only when its replicas' fetches are overdue for longer than the threshold while their
claims keep being rewritten (alive in etcd); not when they are dead (no claim) or paused (a
claim not rewritten), not before the threshold. Then the claim it publishes, and the campaign's
choice that skips it."""

from __future__ import annotations

from tests.support.clock import FakeClock
from tidemq_server.broker.replication.aside import CheckQuorum
from tidemq_server.broker.replication.election import Claim, best_member
from tidemq_server.broker.replication.quorum import Quorum
from tidemq_server.common.etcd import KeyValue

LAG_MAX_S = 1.5  # the Quorum's replica_lag_max_ms in these tests (s)
WAIT_S = 0.2  # the replicas' fetch wait (s)
SILENCE_S = 0.5  # replica_silence_ms: a fetch this overdue is not heard (s)
HEARD_S = WAIT_S + SILENCE_S  # how long a replica is heard after its last fetch (s)
AFTER_S = 1.0  # step_aside_after_s
HOLD_S = 6.0
EPOCH = 4
ME = 0
END = 10_000  # the primary's log end


def setup() -> tuple[CheckQuorum, Quorum, FakeClock]:
    clock = FakeClock()
    q = Quorum(2, LAG_MAX_S, durable=False, sync=True, silence_s=SILENCE_S, clock=clock)
    q.reset(0)  # promoted: a new term starts now
    check = CheckQuorum(q, 2, AFTER_S, HOLD_S, clock)
    return check, q, clock


def fetch_all(q: Quorum) -> None:
    """Both replicas fetch, caught up."""
    for broker_id in (1, 2):
        q.on_fetch(broker_id, f"r{broker_id}", END, END, EPOCH, END, WAIT_S)
    q.advance(END)


def members(revisions: dict[int, int], epoch: int = EPOCH,
            aside: frozenset[int] = frozenset()) -> list[tuple[int, Claim]]:
    """(mod revision, claim) of each live member key: broker id → its last rewrite."""
    return [(rev, Claim(b, f"r{b}", epoch, END, b in aside)) for b, rev in revisions.items()]


def cut_for(check: CheckQuorum, q: Quorum, clock: FakeClock, seconds: float,
            revision: int = 100) -> bool:
    """Replicas silent from now: steps every 0.25 s for ``seconds``; the last ``observe``."""
    due = False
    t = 0.0
    while t < seconds:
        clock.now += 0.25
        t += 0.25
        due = check.observe(revision)
    return due


def test_steps_aside_when_replicas_alive_in_etcd_stop_fetching() -> None:
    check, q, clock = setup()
    fetch_all(q)
    assert not check.observe(100) and not q.cut_off()
    # LAG_MAX_S (1.5 s) sets the elector's term grace and a test's steps must pass it first
    clock.now += LAG_MAX_S
    fetch_all(q)
    # silent replicas are heard for their fetch wait plus SILENCE_S (still in sync for the HWM)
    assert not cut_for(check, q, clock, 0.5) and not q.cut_off()
    clock.now += 0.25
    assert not check.observe(110)  # the cut begins at this step (our claim at revision 110)
    assert q.cut_off() and q.heard_copies() == 1
    assert q.insync_copies() == 3  # told before the lag allowance runs out
    assert not cut_for(check, q, clock, AFTER_S, revision=120)  # AFTER_S exactly: not past it
    assert cut_for(check, q, clock, 0.25, revision=130)
    assert check.cut_for() > AFTER_S
    # both replicas rewrote their claims since the cut began, under our epoch
    why = check.verdict(members({ME: 130, 1: 125, 2: 126}), ME, EPOCH)
    assert why is not None and "1, 2" in why


def test_not_when_the_replicas_are_dead_or_paused() -> None:
    check, q, clock = setup()
    fetch_all(q)
    check.observe(100)
    assert cut_for(check, q, clock, LAG_MAX_S + AFTER_S + 0.5, revision=120)
    base = check.baseline
    assert check.verdict(members({ME: 140}), ME, EPOCH) is None  # dead: keys expired
    assert check.verdict(members({ME: 140, 1: 139}), ME, EPOCH) is None  # one of two: no quorum
    # paused (SIGSTOP): keys still there until their leases lapse, but not rewritten
    assert check.verdict(members({ME: 140, 1: base - 1, 2: base}), ME, EPOCH) is None
    # alive but under an older epoch: they do not know this primary yet (just started)
    assert check.verdict(members({ME: 140, 1: 139, 2: 138}, epoch=EPOCH - 1), ME, EPOCH) is None
    # alive but standing aside themselves: they would not run
    assert check.verdict(members({ME: 140, 1: 139, 2: 138}, aside=frozenset({2})), ME,
                         EPOCH) is None


def test_not_before_the_threshold_and_the_clock_starts_again_after_a_fetch() -> None:
    check, q, clock = setup()
    clock.now += LAG_MAX_S  # past the term's grace
    fetch_all(q)
    assert not cut_for(check, q, clock, HEARD_S + AFTER_S - 0.25)  # cut for < AFTER_S
    fetch_all(q)  # one fetch arrives: not cut off any more
    assert not check.observe(150) and check.cut_for() == 0.0
    assert not cut_for(check, q, clock, HEARD_S + AFTER_S - 0.25, revision=160)


def test_a_held_fetch_is_heard_for_its_wait_and_lag_max_caps_it() -> None:
    _, q, clock = setup()
    clock.now += LAG_MAX_S
    for broker_id in (1, 2):  # fetches held 1 s at the log's end
        q.on_fetch(broker_id, f"r{broker_id}", END, END, EPOCH, END, 1.0)
    clock.now += 1.0 + SILENCE_S - 0.05
    assert q.heard_copies() == 3 and not q.cut_off()
    clock.now += 0.1
    assert q.heard_copies() == 1 and q.cut_off()
    for broker_id in (1, 2):  # a wait longer than the lag allowance: the lag decides
        q.on_fetch(broker_id, f"r{broker_id}", END, END, EPOCH, END, 10.0)
    clock.now += LAG_MAX_S + 0.05
    assert q.cut_off()


def test_replicas_merely_behind_are_not_cut_off() -> None:
    """Fetching but not caught up (a long catch-up): writes wait, but the lead stays."""
    check, q, clock = setup()
    for _ in range(20):
        clock.now += 0.25
        for broker_id in (1, 2):
            q.on_fetch(broker_id, f"r{broker_id}", 10, 10, EPOCH, END)  # far behind
        assert not check.observe(100)
    assert q.insync_copies() == 1 and not q.enough() and not q.cut_off()


def test_a_new_term_gives_the_replicas_the_lag_time_to_start_following() -> None:
    check, q, clock = setup()
    assert not cut_for(check, q, clock, LAG_MAX_S)  # no fetch yet: only the term's grace
    assert cut_for(check, q, clock, AFTER_S + 0.5)  # then counted as any cut


def test_async_replication_never_steps_aside() -> None:
    clock = FakeClock()
    q = Quorum(2, LAG_MAX_S, durable=False, sync=False, clock=clock)
    check = CheckQuorum(q, 2, AFTER_S, HOLD_S, clock)
    assert not cut_for(check, q, clock, 10 * (LAG_MAX_S + AFTER_S))


def test_the_hold_lasts_hold_s_or_until_release_and_keeps_the_hwm() -> None:
    check, q, clock = setup()
    fetch_all(q)
    assert q.hwm == END
    check.stand_aside()
    assert check.holding and check.acked == END and check.cut_since is None
    clock.now += HOLD_S - 0.1
    assert check.holding
    clock.now += 0.2
    assert not check.holding
    check.stand_aside()
    check.release()  # follows a new primary
    assert not check.holding


def _kv(claim: Claim) -> KeyValue:
    return KeyValue("/tidemq/c/g/members/0", claim.encode(), 1, 1, 0)


def test_claim_aside_field_round_trips_and_older_values_read_as_not_aside() -> None:
    aside = Claim(0, "a", 3, 900, aside=True, acked=800)
    assert Claim.decode(_kv(aside)) == aside
    plain = Claim(1, "b", 3, 700)
    assert b"aside" not in plain.encode()  # unchanged for older readers
    old = KeyValue("k", b'{"broker_id": 2, "address": "c", "epoch": 3, "last_offset": 5}', 1,
                   1, 0)
    assert Claim.decode(old) == Claim(2, "c", 3, 5, False, 0)


def test_the_campaign_skips_a_member_standing_aside_but_never_below_what_it_acked() -> None:
    old = Claim(0, "a", 3, 1000, aside=True, acked=800)
    behind, best = Claim(1, "b", 3, 700), Claim(2, "c", 3, 900)
    assert best_member([old, behind, best]) == best  # not the largest offset: it stands aside
    # the only replica left lacks acknowledged bytes: nobody runs until the old one does
    assert best_member([old, behind]) is None
    assert best_member([Claim(0, "a", 3, 1000), behind]) == Claim(0, "a", 3, 1000)
