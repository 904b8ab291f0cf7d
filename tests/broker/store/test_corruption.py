"""Junk bytes and truncation at random positions of the last segment → recovery to the last
valid record; a corrupt record is never served."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import pytest

from services.broker.store import MessageStore
from tests.broker.store.conftest import make_record, small_config


def crash(store: MessageStore) -> None:
    """Stop without a final checkpoint, as a SIGKILL would (files are already in the OS)."""
    for task in [*(loop._task for loop in store._loops), *store.writer._tasks]:
        if task is not None:
            task.cancel()
    store.dispatcher.close()
    store.index.close()
    store.log.close()


async def _written(root: Path) -> tuple[list[tuple[int, int]], int]:
    store = await MessageStore.open(small_config(root, flush_interval_ms=3_600_000))
    await store.put([make_record(i, queue_id=i % 2, size=700) for i in range(40)])
    await store.checkpoint()
    checkpointed = store.log.write_offset
    res = await store.put([make_record(i, queue_id=i % 2, size=700) for i in range(40, 200)])
    spots = [(a.physical_offset, a.size) for a in res.appended]
    await asyncio.sleep(0)
    crash(store)
    return spots, checkpointed


def _flip(path: Path, pos: int, n: int) -> None:
    """Invert ``n`` bytes at ``pos``: junk that certainly differs from what was there."""
    with open(path, "r+b") as f:
        f.seek(pos)
        old = f.read(n)
        f.seek(pos)
        f.write(bytes(b ^ 0xFF for b in old))


def _last_segment(root: Path) -> Path:
    return sorted((root / "commitlog").iterdir())[-1]


@pytest.mark.parametrize("seed", range(12))
async def test_junk_in_last_segment_recovers_to_last_valid_record(store_dir: Path,
                                                                   seed: int) -> None:
    spots, _ = await _written(store_dir)
    seg = _last_segment(store_dir)
    start = int(seg.name)
    size = seg.stat().st_size
    rnd = random.Random(seed)
    pos = rnd.randrange(0, size - 1)
    _flip(seg, pos, 8)
    hit = start + pos
    survivors = [o for o, n in spots if o + n <= hit]
    store = await MessageStore.open(small_config(store_dir))
    alive = [i for i in range(40, 200) if store.find_by_unique_key(f"id-T-{i}")]
    assert len(alive) == len(survivors)  # every record before the junk, none after
    for q in (0, 1):
        got = store.get("T", q, 0, 1000).records
        assert all(r.physical_offset < hit for r in got if r.physical_offset >= start)
        assert [r.queue_offset for r in got] == list(range(len(got)))
    res = await store.put([make_record(999)])  # the store takes writes again
    assert store.read(res.appended[0].physical_offset) is not None
    await store.close()


@pytest.mark.parametrize("seed", range(8))
async def test_truncation_recovers_to_last_whole_record(store_dir: Path, seed: int) -> None:
    spots, _ = await _written(store_dir)
    seg = _last_segment(store_dir)
    start = int(seg.name)
    cut = random.Random(seed).randrange(0, seg.stat().st_size)
    os.truncate(seg, cut)
    store = await MessageStore.open(small_config(store_dir))
    whole = [o + n for o, n in spots if o >= start and o + n <= start + cut]
    assert store.log.write_offset == max([start, *whole])
    assert len([o for o, n in spots if store.read(o) is not None]) == \
        len([o for o, n in spots if o + n <= start + cut])
    for q in (0, 1):
        lo, hi = store.queue_offsets("T", q)
        assert len(store.get("T", q, 0, 1000).records) == hi - lo
    await store.close()


async def test_corrupt_record_below_checkpoint_is_never_served(store_dir: Path) -> None:
    _, checkpointed = await _written(store_dir)
    store = await MessageStore.open(small_config(store_dir))
    victim = store.get("T", 0, 0, 1).records[0]
    await store.close()
    seg = sorted((store_dir / "commitlog").iterdir())[0]
    _flip(seg, victim.physical_offset + 200, 4)
    store = await MessageStore.open(small_config(store_dir))
    assert victim.physical_offset < checkpointed
    assert store.read(victim.physical_offset) is None
    got = store.get("T", 0, 0, 5).records
    assert victim.physical_offset not in [r.physical_offset for r in got]
    await store.close()
