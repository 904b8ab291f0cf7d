from __future__ import annotations

from pathlib import Path

from tidemq_server.broker.store.consume_queue import UNIT_SIZE, ConsumeQueue


def test_units_span_files_and_reload(tmp_path: Path) -> None:
    cq = ConsumeQueue(tmp_path, "T", 0, units_per_file=10)
    for i in range(25):
        cq.append(i, i * 100, 50, i % 3)
    cq.write_pending()
    assert cq.max_offset == 25
    assert cq.read_units(8, 5) == [(i * 100, 50, i % 3) for i in range(8, 13)]
    cq.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert [int(f) for f in files] == [0, 10, 20]
    again = ConsumeQueue(tmp_path, "T", 0, units_per_file=10)
    again.load()
    assert again.max_offset == 25 and again.read_units(24, 10) == [(2400, 50, 0)]
    again.close()


def test_truncate_from_physical_keeps_older_units(tmp_path: Path) -> None:
    cq = ConsumeQueue(tmp_path, "T", 0, units_per_file=10)
    for i in range(25):
        cq.append(i, i * 100, 50, 0)
    cq.write_pending()
    cq.truncate_from_physical(1250)
    assert cq.max_offset == 13
    assert cq.read_units(12, 5) == [(1200, 50, 0)]
    cq.append(13, 9999, 1, 0)
    cq.write_pending()
    assert cq.read_units(13, 1) == [(9999, 1, 0)]
    cq.close()


def test_torn_unit_at_tail_is_dropped_on_load(tmp_path: Path) -> None:
    cq = ConsumeQueue(tmp_path, "T", 0, units_per_file=10)
    for i in range(3):
        cq.append(i, i, 1, 0)
    cq.write_pending()
    cq.close()
    with open(tmp_path / f"{0:020d}", "ab") as f:
        f.write(b"\x01" * (UNIT_SIZE // 2))
    again = ConsumeQueue(tmp_path, "T", 0, units_per_file=10)
    again.load()
    assert again.max_offset == 3
    again.close()


def test_advance_min_deletes_dead_files(tmp_path: Path) -> None:
    cq = ConsumeQueue(tmp_path, "T", 0, units_per_file=10)
    for i in range(35):
        cq.append(i, i * 100, 50, 0)
    cq.write_pending()
    cq.advance_min(2150)
    assert cq.min_offset == 22
    assert sorted(int(p.name) for p in tmp_path.iterdir()) == [20, 30]
    cq.close()
