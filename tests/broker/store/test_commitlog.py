from __future__ import annotations

from pathlib import Path

from tidemq_server.broker.store.commitlog import CommitLog
from tidemq_server.broker.store.records import v1 as record
from tidemq_server.broker.store.types import MessageRecord


def _rec_bytes(log: CommitLog, i: int, size: int = 1000) -> bytes:
    rec = MessageRecord("T", 0, bytes([i % 256]) * size, {"UNIQ_KEY": str(i)})
    payload = record.encode_payload(rec)
    total = record.HEADER_SIZE - 4 + len(payload)
    return record.encode_header(rec, total, i, log.write_offset, 1, b"\0" * 8, payload) + payload


def _append(log: CommitLog, i: int) -> int:
    data = _rec_bytes(log, i)
    if not log.fits(len(data)):
        log.roll()
        data = _rec_bytes(log, i)
    at = log.write_offset
    log.write(data)
    return at


def test_segments_roll_and_are_named_by_start_offset(tmp_path: Path) -> None:
    log = CommitLog(tmp_path, 8192)
    log.open()
    offsets = [_append(log, i) for i in range(20)]
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[0] == "0" * 20 and all(len(n) == 20 for n in names)
    assert [int(n) for n in names] == [i * 8192 for i in range(len(names))]
    for i, off in enumerate(offsets):
        rec = log.read(off)
        assert rec is not None and rec.properties["UNIQ_KEY"] == str(i)
    log.close()


def test_reopen_and_scan_yields_every_record_in_order(tmp_path: Path) -> None:
    log = CommitLog(tmp_path, 8192)
    log.open()
    offsets = [_append(log, i) for i in range(30)]
    end = log.write_offset
    log.close()
    log = CommitLog(tmp_path, 8192)
    log.open()
    seen = [phys for _, _, phys, _ in log.scan(0)]
    assert seen == offsets and log.scan_end == end
    log.close()


def test_truncate_drops_tail_and_later_segments(tmp_path: Path) -> None:
    log = CommitLog(tmp_path, 8192)
    log.open()
    offsets = [_append(log, i) for i in range(30)]
    log.truncate(offsets[5])
    assert log.write_offset == offsets[5]
    assert log.read(offsets[5]) is None and log.read(offsets[4]) is not None
    assert len(log.segments) == offsets[5] // 8192 + 1
    assert _append(log, 99) == offsets[5]
    log.close()


def test_read_outside_the_log_is_none(tmp_path: Path) -> None:
    log = CommitLog(tmp_path, 8192)
    log.open()
    _append(log, 1)
    assert log.read(log.write_offset) is None and log.read(-5) is None and log.read(3) is None
    log.close()
