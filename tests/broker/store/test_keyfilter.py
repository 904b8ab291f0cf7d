"""The index's recent-key filter: never "absent" for a key the index holds since its start."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from tests.broker.store.conftest import make_record, small_config
from tidemq_server.broker.store import MessageStore
from tidemq_server.broker.store.index import Index, key_hash
from tidemq_server.broker.store.keyfilter import KeyFilter


def test_a_filter_holds_every_hash_it_was_given_and_few_others() -> None:
    f = KeyFilter(since_ms=0, nbits=1 << 16)
    rng = random.Random(7)
    given = [rng.getrandbits(32) for _ in range(2_000)]
    f.add_all(given[:1_000])
    for h in given[1_000:]:
        f.add(h)
    assert all(f.may_hold(h) for h in given)
    others = [rng.getrandbits(32) for _ in range(10_000)]
    maybe = sum(f.may_hold(h) for h in others if h not in set(given))
    assert maybe < 600  # ~3 % of bits set: a few hundred "maybe" of 10,000
    assert not f.saturated


def test_a_filter_is_full_past_one_hash_per_eight_bits() -> None:
    f = KeyFilter(since_ms=0, nbits=1 << 10)
    f.add_all(list(range(128)))
    assert not f.saturated
    f.add(999)
    assert f.saturated


@pytest.mark.parametrize("nbits", [0, 7, 100, 1 << 10 | 1])
def test_a_filter_size_is_a_power_of_two(nbits: int) -> None:
    with pytest.raises(ValueError, match="power of two"):
        KeyFilter(0, nbits)


def test_index_filter_never_denies_a_key_indexed_since_its_start(tmp_path: Path) -> None:
    idx = Index(tmp_path, slots=31, entries=50)  # small files: the scan crosses several
    idx.open()
    for i in range(120):  # ms 1000..1119, before and after the filter's start at 1060
        idx.put(f"old-{i}", i, 1000 + i)
    idx.close()
    again = Index(tmp_path, slots=31, entries=50)
    again.open()
    assert again.track_recent(1060)
    for i in range(120, 200):  # puts after the filter started
        again.put_unique(f"new-{i}", i, 1000 + i)
        again.put(f"other-{i}", i, 1000 + i)  # not a unique key: the filter skips it
    held = [f"old-{i}" for i in range(60, 120)] + [f"new-{i}" for i in range(120, 200)]
    for key in held:
        assert not again.surely_absent(key, 1060), key
        assert not again.surely_absent(key, 1100), key
    # keys never indexed (and those indexed only before 1060) are mostly answered "absent"
    never = [f"never-{i}" for i in range(1_000)] + [f"old-{i}" for i in range(60)]
    absent = [k for k in never if again.surely_absent(k, 1060)]
    assert len(absent) > 0.95 * len(never)
    for key in absent:  # and each such answer is true of the index itself
        assert not [p for p in again.lookup(key, 1060) if p >= 60]
    # an earlier horizon than the filter's start is not the filter's to answer
    assert not again.surely_absent("never-0", 1059)
    again.close()


def test_no_filter_when_the_window_holds_too_many_keys(tmp_path: Path) -> None:
    idx = Index(tmp_path, slots=31, entries=1_000)
    idx.open()
    for i in range(300):
        idx.put(f"k-{i}", i, 5000 + i)
    assert not idx.track_recent(5000, scan_max=200)
    assert idx.filter is None
    assert not idx.surely_absent("never", 5000)  # without a filter: always ask the index
    assert idx.track_recent(5200, scan_max=200)  # 100 keys since 5200: fits
    idx.close()


def test_a_full_filter_is_dropped(tmp_path: Path) -> None:
    idx = Index(tmp_path, slots=31, entries=10_000)
    idx.open()
    assert idx.track_recent(0)
    assert idx.filter is not None
    idx.filter = KeyFilter(0, nbits=1 << 8)  # 32 hashes fill it
    for i in range(40):
        idx.put_unique(f"k-{i}", i, 10 + i)
    assert idx.filter is None
    assert not idx.surely_absent("never", 0)
    idx.close()


def test_hashes_are_the_index_hashes() -> None:
    f = KeyFilter(0, nbits=1 << 12)
    f.add(key_hash("U\0some-id"))
    assert f.may_hold(key_hash("U\0some-id"))


async def test_store_answers_recent_unique_key_lookups_without_the_index(
        store_dir: Path) -> None:
    s = await MessageStore.open(small_config(store_dir))
    await s.put([make_record(i, queue_id=i % 2) for i in range(40)])
    await s.close()
    s = await MessageStore.open(small_config(store_dir))  # a restart: the dedup window's case
    try:
        since = int(time.time() * 1000) - 600_000
        assert s.track_recent_keys(since)
        await s.put([make_record(i, queue_id=i % 2) for i in range(100, 110)])
        reads = 0
        lookup = s.index.lookup

        def counting(key: str, begin_ms: int = 0, end_ms: int = 2**62) -> list[int]:
            nonlocal reads
            reads += 1
            return lookup(key, begin_ms, end_ms)

        s.index.lookup = counting  # type: ignore[method-assign]
        for i in [*range(40), *range(100, 110)]:  # before and after the restart: found
            (rec,) = s.find_by_unique_key(f"id-T-{i}", whole_log=True, since_ms=since)
            assert rec.message_id == f"id-T-{i}"
        found_reads = reads
        assert found_reads == 50
        misses = [s.find_by_unique_key(f"new-{i}", whole_log=True, since_ms=since)
                  for i in range(1_000)]
        assert misses == [[]] * 1_000
        assert reads - found_reads < 10  # the filter answered nearly all of them
        # without since_ms (queries of the whole history) the index is always read
        before = reads
        assert s.find_by_unique_key("new-1") == []
        assert reads == before + 1
    finally:
        await s.close()


async def test_a_store_stops_tracking_when_told(store_dir: Path) -> None:
    s = await MessageStore.open(small_config(store_dir))
    try:
        assert s.track_recent_keys(0)
        assert s.index.surely_absent("U\0never", 0)
        s.stop_tracking_recent_keys()  # the dedup window after the start is over
        assert s.index.filter is None
        assert not s.index.surely_absent("U\0never", 0)  # the index is asked again
        await s.put([make_record(1)])  # puts no longer feed a filter
        assert s.index.filter is None
    finally:
        await s.close()
