from __future__ import annotations

from pathlib import Path

from tidemq_server.broker.store.index import Index


def test_lookup_finds_all_entries_of_a_key_in_time_range(tmp_path: Path) -> None:
    idx = Index(tmp_path, slots=7, entries=100)  # few slots: chains and hash sharing
    idx.open()
    for i in range(60):
        idx.put(f"key-{i % 5}", i * 10, 1000 + i)
    got = idx.lookup("key-2")
    assert sorted(got) == [i * 10 for i in range(60) if i % 5 == 2]
    ranged = idx.lookup("key-2", 1010, 1030)
    assert sorted(ranged) == [120, 170, 220, 270]
    idx.close()


def test_rolls_to_new_file_when_full_and_reopens(tmp_path: Path) -> None:
    idx = Index(tmp_path, slots=11, entries=10)
    idx.open()
    for i in range(35):
        idx.put("same", i, 5000 + i)
    assert len(idx.files) == 4
    idx.close()
    again = Index(tmp_path, slots=11, entries=10)
    again.open()
    assert sorted(again.lookup("same")) == list(range(35))
    again.delete_before(20)
    assert sorted(again.lookup("same")) == list(range(20, 35))
    again.close()
