"""Pure parts of the scheduler: its timer log, bucket marks, wheel and checkpoint (the broker's
delay router: tests/broker/delays/; the delay table: tests/common/test_delaylevels.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tidemq_server.scheduler.buckets import MARK, Mark, read_marks
from tidemq_server.scheduler.timerlog import CorruptEntry, TimerLog, decode, encode
from tidemq_server.scheduler.wheel import Wheel

NOW = 1_800_000_000_000


def test_timer_log_round_trip_and_torn_tail(tmp_path: Path) -> None:
    log = TimerLog(tmp_path, segment_bytes=200)
    log.open()
    entries = [encode(NOW + i, NOW, i, bytes([i]) * 60) for i in range(6)]
    positions, fds = log.append(entries)
    log.sync(fds)
    assert len(log.starts) > 1  # rolled: 200-byte segments hold two 96-byte entries
    for pos, data, i in zip(positions, entries, range(6), strict=True):
        entry = log.read(pos, len(data))
        assert (entry.due_ms, entry.intake, entry.payload) == (NOW + i, i, bytes([i]) * 60)
    with pytest.raises(CorruptEntry):
        decode(entries[1][:-1] + b"\x00", 0, 0)  # a flipped byte
    with open(tmp_path / f"{log.starts[-1]:020d}", "ab") as f:
        f.write(entries[0][:50])  # a torn write at the tail
    log.close()
    again = TimerLog(tmp_path, segment_bytes=200)
    again.open()
    assert [e.intake for e in again.scan(0)] == list(range(6))
    assert again.write_offset == positions[-1] + len(entries[-1])


def test_a_new_segment_is_made_durable_by_the_sync_not_the_append(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first timer of a fresh store creates a segment: the directory fsync that makes it
    durable belongs to ``sync`` (run in a thread), not to ``append`` (on the event loop, where
    a slow disk would hold up every delivery, the level walk too)."""
    synced: list[Path] = []
    monkeypatch.setattr("tidemq_server.scheduler.timerlog.fsync_dir", synced.append)
    log = TimerLog(tmp_path, segment_bytes=1 << 20)
    log.open()
    _, fds = log.append([encode(NOW, NOW, 0, b"x" * 60)])
    assert synced == [] and log.starts == [0]
    log.sync(fds)
    assert synced == [tmp_path]
    _, fds = log.append([encode(NOW, NOW, 1, b"y" * 60)])  # same segment: no directory sync
    log.sync(fds)
    assert synced == [tmp_path]


def test_marks_keep_the_first_final_state() -> None:
    data = b"".join(MARK.pack(p, m) for p, m in [(1, Mark.INTENT), (1, Mark.DELIVERED),
                                                  (2, Mark.INTENT), (3, Mark.CANCELLED),
                                                  (3, Mark.DELIVERED)])
    assert read_marks(data + b"\x00\x01") == {1: Mark.DELIVERED, 2: Mark.INTENT,
                                               3: Mark.CANCELLED}


def test_wheel_hands_over_in_time_never_early() -> None:
    wheel = Wheel(tick_ms=100, width_ms=3_600_000)
    bucket = NOW - NOW % 3_600_000
    for i, due in enumerate([NOW + 250, NOW + 20, NOW + 240, NOW - 5000, NOW + 990]):
        wheel.add(due, i, 10, bucket)
    assert wheel.next_due() == NOW - 5000
    got = [(d.dues.tolist(), d.positions.tolist()) for d in wheel.pop_due(NOW + 245)]
    flat = sorted(p for _, ps in got for p in ps)
    assert flat == [1, 2, 3]
    assert all(due <= NOW + 245 for dues, _ in got for due in dues)
    assert wheel.remove(NOW + 990, 4, bucket) and not wheel.holds(NOW + 990, 4, bucket)
    assert [d.positions.tolist() for d in wheel.pop_due(NOW + 10_000)] == [[0]]
    assert wheel.count == 0 and wheel.next_due() is None


def test_index_sizes_survive_in_the_checkpoint(tmp_path: Path) -> None:
    from tidemq_server.scheduler.checkpoint import Checkpoint

    cp = Checkpoint(indexed_end=10, ingested_next=3, buckets={NOW: 56}, segments={0: NOW})
    cp.save(tmp_path / "cp.json")
    assert Checkpoint.load(tmp_path / "cp.json") == cp
    assert Checkpoint.load(tmp_path / "missing.json") is None
    assert not os.path.exists(tmp_path / "cp.tmp")
