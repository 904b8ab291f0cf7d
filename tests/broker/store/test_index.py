from __future__ import annotations

from pathlib import Path

from tidemq_server.broker.store.index import Index, unique_key


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


def test_a_batch_of_unique_keys_indexes_as_one_by_one_puts(tmp_path: Path) -> None:
    one, many = Index(tmp_path / "one", 64, 100), Index(tmp_path / "many", 64, 100)
    one.open()
    many.open()
    try:
        assert one.track_recent(0) and many.track_recent(0)
        for batch in range(30):  # 120 entries: the third file of each is started one by one
            ids = [unique_key(f"id{batch}-{i}") for i in range(4)]
            offs = [batch * 4096 + i * 100 for i in range(4)]
            for key, at in zip(ids, offs, strict=True):
                one.put_unique(key, at, 1_000 + batch)
            many.put_unique_many(ids, offs, 1_000 + batch)
        assert [f.path.name for f in one.files] == [f.path.name for f in many.files]
        for a, b in zip(one.files, many.files, strict=True):
            a.flush()
            b.flush()
            assert bytes(a.mm) == bytes(b.mm)
        assert many.lookup(unique_key("id7-2")) == [7 * 4096 + 200]
        assert one.filter is not None and many.filter is not None
        assert one.filter.bits == many.filter.bits and one.filter.adds == many.filter.adds
    finally:
        one.close()
        many.close()
