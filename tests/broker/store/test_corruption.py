"""Junk bytes and truncation at random positions of the last segment → recovery to the last
valid entry; a corrupt record is never served. The log's entries are format v2 batches, so a
batch is kept or cut whole: junk anywhere in it drops its every record."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import pytest

from tests.broker.store.conftest import make_record, small_config
from tidemq_server.broker.store import MessageStore


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


def _batch_ends(root: Path, spots: list[tuple[int, int]]) -> list[int]:
    """Where the batch holding each record (at ``spots``) ends in the log."""
    segments = {int(p.name): p.read_bytes() for p in (root / "commitlog").iterdir()}
    seg_bytes = small_config(root).segment_bytes
    ends = []
    for o, _ in spots:
        start = o - o % seg_bytes
        data = segments[start]
        batch = o - int.from_bytes(data[o - start + 4:o - start + 8], "big")
        ends.append(batch + int.from_bytes(data[batch - start:batch - start + 4], "big"))
    return ends


def _last_segment(root: Path) -> Path:
    return sorted((root / "commitlog").iterdir())[-1]


@pytest.mark.parametrize("seed", range(12))
async def test_junk_in_last_segment_recovers_to_last_valid_record(store_dir: Path,
                                                                   seed: int) -> None:
    spots, _ = await _written(store_dir)
    ends = _batch_ends(store_dir, spots)
    seg = _last_segment(store_dir)
    start = int(seg.name)
    size = seg.stat().st_size
    rnd = random.Random(seed)
    pos = rnd.randrange(0, size - 1)
    _flip(seg, pos, 8)
    hit = start + pos
    survivors = [o for o, end in zip(spots, ends, strict=True) if end <= hit]
    store = await MessageStore.open(small_config(store_dir))
    alive = [i for i in range(40, 200) if store.find_by_unique_key(f"id-T-{i}")]
    assert len(alive) == len(survivors)  # every batch before the junk, none after
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
    ends = _batch_ends(store_dir, spots)
    seg = _last_segment(store_dir)
    start = int(seg.name)
    cut = random.Random(seed).randrange(0, seg.stat().st_size)
    os.truncate(seg, cut)
    store = await MessageStore.open(small_config(store_dir))
    whole = [end for (o, _), end in zip(spots, ends, strict=True)
             if o >= start and end <= start + cut]
    assert store.log.write_offset == max([start, *whole])
    assert len([o for o, n in spots if store.read(o) is not None]) == \
        len([end for end in ends if end <= start + cut])
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


@pytest.mark.parametrize("damage", ["bit", "junk"])
async def test_a_damaged_checkpoint_is_reported_and_everything_re_dispatched(
        store_dir: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    """A flipped bit in the checkpoint once stopped the broker at start (not UTF-8), or could
    make recovery trust queues past what was dispatched: now it is detected (CRC), named in
    the log, and the whole log is re-dispatched."""
    spots, _ = await _written(store_dir)
    ckpt = store_dir / "checkpoint"
    raw = bytearray(ckpt.read_bytes())
    at = raw.index(b'"dispatched": ') + len(b'"dispatched": ')
    if damage == "bit":
        raw[at] ^= 0x01  # still a digit: valid JSON, a wrong offset
    else:
        raw[at] = 0xA0  # not UTF-8 any more
    ckpt.write_bytes(bytes(raw))
    with caplog.at_level("ERROR"):
        store = await MessageStore.open(small_config(store_dir))
    assert any(str(ckpt) in r.getMessage() and "re-dispatching" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert store.recovered_records == 200  # every record, not only those past the checkpoint
    total = sum(len(store.get("T", q, 0, 1000).records) for q in (0, 1))
    assert total == 200 and len(spots) == 160
    await store.close()
    reopened = await MessageStore.open(small_config(store_dir))  # a good checkpoint again
    assert reopened.recovered_records == 0
    await reopened.close()


@pytest.mark.parametrize("where", ["body", "size"])
async def test_damage_in_a_sealed_segment_keeps_every_later_segment(
        store_dir: Path, where: str, caplog: pytest.LogCaptureFixture) -> None:
    """Re-scanned from the start (its checkpoint lost), a log with a flipped bit in a sealed
    segment once truncated everything after it: every later segment, acknowledged records
    and all. Now the damaged record (or the rest of its segment, when its size field is hit)
    is skipped, named in the log, never served; the later segments stay whole."""
    spots, _ = await _written(store_dir)  # 200 records of ~800 B: four 64 KiB segments
    segments = sorted((store_dir / "commitlog").iterdir())
    assert len(segments) >= 3
    store = await MessageStore.open(small_config(store_dir))
    victim = store.get("T", 0, 3, 1).records[0]  # in the first segment
    await store.close()
    offset_in_seg = victim.physical_offset - int(segments[0].name)
    _flip(segments[0], offset_in_seg + (300 if where == "body" else 1), 1)
    (store_dir / "checkpoint").unlink()  # re-dispatched from the start
    with caplog.at_level("ERROR"):
        store = await MessageStore.open(small_config(store_dir))
    assert segments[0].name in caplog.text and str(victim.physical_offset) in caplog.text
    assert store.log.skipped and store.log.skipped[0][0] == victim.physical_offset
    assert store.read(victim.physical_offset) is None  # never served
    kept = {r.physical_offset for q in (0, 1) for r in store.get("T", q, 0, 1000).records}
    later = {phys for phys, _ in spots if phys >= int(segments[1].name)}
    assert later <= kept  # every record of the later segments is still served
    assert victim.physical_offset not in kept
    if where == "body":
        assert len(kept) == 199  # only the damaged record is missing
    await store.close()
