"""Pure parts of delayed delivery: the delay table, the broker's router and state view, the
scheduler's timer log, bucket marks and wheel."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tidemq.protocol import (
    DELAY,
    REAL_QID,
    REAL_TOPIC,
    TIMER_DELIVER_MS,
    ErrorCode,
    ProtocolError,
    SystemTopic,
)

from services.broker.consumers.retry import latest_copy
from services.broker.delays.routing import INTAKE_TOPIC, SCHEDULE_TOPIC, DelayRouter, delay_view
from services.broker.messaging.query import MessageState
from services.broker.store.types import MessageRecord, StoredRecord
from services.common.delaylevels import (
    DEFAULT_DELAY_LEVELS,
    format_duration,
    parse_delay_levels,
    parse_duration_ms,
)
from services.scheduler.buckets import MARK, Mark, read_marks
from services.scheduler.timerlog import CorruptEntry, TimerLog, decode, encode
from services.scheduler.wheel import Wheel

DAY = 86_400_000
NOW = 1_800_000_000_000


def test_delay_table_parsing() -> None:
    levels = parse_delay_levels(DEFAULT_DELAY_LEVELS)
    assert len(levels) == 18
    assert levels[:4] == (1000, 5000, 10_000, 30_000) and levels[-1] == 7_200_000
    assert parse_delay_levels("250ms, 1s 2m") == (250, 1000, 120_000)
    assert parse_duration_ms("3d") == 3 * DAY
    assert format_duration(3_600_000) == "1h" and format_duration(1500) == "1500ms"
    for bad in ("", "1s " * 19, "1x", "0s", "-1s"):
        with pytest.raises(ValueError):
            parse_delay_levels(bad)


def _router() -> DelayRouter:
    return DelayRouter(parse_delay_levels("1s 2s 3s"), max_delay_ms=30 * DAY)


def test_due_times_and_invalid_delays() -> None:
    d = _router()
    assert d.due_for(NOW, delay_level=2) == NOW + 2000
    assert d.due_for(NOW, delay_ms=1500) == NOW + 1500
    assert d.due_for(NOW, delay_ms=0) is None  # delivered at once
    assert d.due_for(NOW, deliver_at_ms=NOW - 5) is None  # in the past: at once
    assert d.due_for(NOW, deliver_at_ms=NOW + 30 * DAY) == NOW + 30 * DAY
    bad = [{"delay_level": 4}, {"delay_level": -1}, {"delay_ms": -1},
           {"delay_ms": 30 * DAY + 1}, {"deliver_at_ms": NOW + 30 * DAY + 1},
           {"deliver_at_ms": -3}, {"delay_level": 1, "delay_ms": 5}]
    for fields in bad:
        with pytest.raises(ProtocolError) as info:
            d.due_for(NOW, **fields)
        assert info.value.code is ErrorCode.INVALID_DELAY, fields
    with pytest.raises(ProtocolError, match=str(30 * DAY)):
        d.due_for(NOW, deliver_at_ms=NOW + 31 * DAY)  # the message names the limit


def test_waiting_copies_keep_the_message_whole() -> None:
    held: list[bool] = []
    d = DelayRouter(parse_delay_levels("1s 2s 3s"), max_delay_ms=30 * DAY,
               on_first_delay=lambda: held.append(True))
    rec = MessageRecord(topic="Orders", queue_id=3, body=b"b", properties={"UNIQ_KEY": "m",
                        "TAGS": "t", "KEYS": "k"}, tag_code=7, flag=1, born_timestamp=5)
    level = d.route_record(rec, NOW, delay_level=3)
    assert (level.topic, level.queue_id, level.tag_code) == (SCHEDULE_TOPIC, 2, NOW + 3000)
    assert level.properties[REAL_TOPIC] == "Orders" and level.properties[REAL_QID] == "3"
    assert level.properties[DELAY] == "3" and level.properties["TAGS"] == "t"
    timer = d.route_record(rec, NOW, delay_ms=90_000)
    assert (timer.topic, timer.queue_id) == (INTAKE_TOPIC, 0)
    assert timer.properties[TIMER_DELIVER_MS] == str(NOW + 90_000)
    assert d.route_record(rec, NOW) is rec
    assert held == [True]  # the retention hold is asked for once


def _stored(topic: str, props: dict[str, str], n: int = 0) -> StoredRecord:
    return StoredRecord(physical_offset=n, size=1, topic=topic, queue_id=0, queue_offset=n,
                        body=b"", properties={"UNIQ_KEY": "m", **props}, flag=0, sys_flag=0,
                        born_timestamp=1, born_host="", store_timestamp=n, store_host="",
                        reconsume_times=0, prepared_tx_offset=0)


def test_message_state_of_a_delayed_message() -> None:
    waiting = _stored(INTAKE_TOPIC, {REAL_TOPIC: "Orders", REAL_QID: "2",
                                     TIMER_DELIVER_MS: "9"})
    shown, state = delay_view([waiting]) or (None, None)
    assert state is MessageState.SCHEDULED and shown is not None
    assert (shown.topic, shown.queue_id) == ("Orders", 2)
    cancel = _stored(SystemTopic.TIMER_CANCELS, {}, 2)
    assert delay_view([waiting, cancel])[1] is MessageState.CANCELLED  # type: ignore[index]
    delivered = _stored("Orders", {}, 3)
    assert delay_view([waiting, delivered]) is None  # stored: the default view
    half = _stored("RMQ_SYS_TRANS_HALF_TOPIC", {}, 4)
    assert delay_view([waiting, half])[1] is MessageState.SCHEDULED  # type: ignore[index]
    # a retry waiting out its back-off is the group's own copy to continue from
    retry_wait = _stored(SCHEDULE_TOPIC, {REAL_TOPIC: "%RETRY%g"}, 5)
    assert latest_copy([delivered, retry_wait], "g") is retry_wait
    assert latest_copy([delivered, retry_wait], "other") is delivered


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
    from services.scheduler.checkpoint import Checkpoint

    cp = Checkpoint(indexed_end=10, ingested_next=3, buckets={NOW: 56}, segments={0: NOW})
    cp.save(tmp_path / "cp.json")
    assert Checkpoint.load(tmp_path / "cp.json") == cp
    assert Checkpoint.load(tmp_path / "missing.json") is None
    assert not os.path.exists(tmp_path / "cp.tmp")
