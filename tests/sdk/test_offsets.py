from __future__ import annotations

from tidemq import OffsetTracker


def test_out_of_order_completion_commits_only_the_contiguous_prefix() -> None:
    t = OffsetTracker(10)
    assert t.committable() == 10
    t.pulled([10, 11, 12, 13, 14], next_offset=15)
    assert t.committable() == 10
    for offset in (12, 14, 11):
        t.done(offset)
    assert t.committable() == 10  # 10 still runs
    t.done(10)
    assert t.committable() == 13  # 13 still runs
    t.done(13)
    assert t.committable() == 15 and t.in_flight == 0


def test_skipped_offsets_advance_with_next_offset() -> None:
    t = OffsetTracker(0)
    t.pulled([], next_offset=40)  # the broker skipped 40 messages of other tags
    assert t.committable() == 40
    t.pulled([40, 45], next_offset=50)
    t.done(45)
    assert t.committable() == 40
    t.done(40)
    assert t.committable() == 50


def test_commit_due_only_when_changed_and_reset() -> None:
    t = OffsetTracker(5)
    assert t.commit_due() == 5
    t.committed = 5
    assert t.commit_due() is None
    t.pulled([5], 6)
    assert t.commit_due() is None
    t.done(5)
    assert t.commit_due() == 6
    t.pulled([6, 7], 8)
    t.reset(100)
    assert t.committable() == 100 and t.in_flight == 0
    t.done(6)  # a late finish of a forgotten offset changes nothing
    assert t.committable() == 100
