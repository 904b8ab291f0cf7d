from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from tests.broker.store.conftest import make_record, small_config
from tests.support.clock import now_ms
from tidemq_server.broker.store import (
    FlushMode,
    GetStatus,
    MessageRecord,
    MessageStore,
    PutStatus,
    SysFlag,
    tag_code,
)


async def test_put_assigns_contiguous_queue_offsets(store: MessageStore) -> None:
    results = await asyncio.gather(*(store.put([make_record(i, queue_id=i % 2)])
                                     for i in range(40)))
    assert all(r.status == PutStatus.OK for r in results)
    by_queue: dict[int, list[int]] = {0: [], 1: []}
    for r in results:
        a = r.appended[0]
        by_queue[a.queue_id].append(a.queue_offset)
    assert sorted(by_queue[0]) == list(range(20)) and sorted(by_queue[1]) == list(range(20))
    assert store.queue_offsets("T", 0) == (0, 20)


async def test_batch_is_contiguous_and_in_order(store: MessageStore) -> None:
    res = await store.put([make_record(i) for i in range(10)])
    offs = [a.physical_offset for a in res.appended]
    assert offs == sorted(offs)
    assert [a.queue_offset for a in res.appended] == list(range(10))


async def test_get_semantics_at_edges(store: MessageStore) -> None:
    await store.put([make_record(i) for i in range(5)])
    res = store.get("T", 0, 0, 3)
    assert res.status == GetStatus.FOUND and res.next_offset == 3
    assert [r.message_id for r in res.records] == ["id-T-0", "id-T-1", "id-T-2"]
    assert store.get("T", 0, 5, 3).status == GetStatus.NO_MESSAGE
    assert store.get("T", 0, 6, 3).status == GetStatus.OFFSET_OVERFLOW
    unknown = store.get("Nope", 0, 0, 3)
    assert unknown.status == GetStatus.NO_MESSAGE and unknown.max_offset == 0


async def test_tag_filter_skips_units_server_side(store: MessageStore) -> None:
    await store.put([make_record(i, tag="a" if i % 3 == 0 else "b") for i in range(30)])
    res = store.get("T", 0, 0, 4, frozenset({tag_code("a")}))
    assert [r.message_id for r in res.records] == [f"id-T-{i}" for i in (0, 3, 6, 9)]
    assert res.next_offset == 10
    none = store.get("T", 0, 28, 4, frozenset({tag_code("zzz")}))
    assert none.status == GetStatus.NO_MATCHED and none.next_offset == 30


async def test_half_and_rollback_records_are_not_dispatched(store: MessageStore) -> None:
    half = make_record(1, topic="Real", sys_flag=SysFlag.PREPARED)
    rollback = make_record(2, topic="Real", sys_flag=SysFlag.ROLLBACK)
    commit = make_record(3, topic="Real", sys_flag=SysFlag.COMMIT)
    await store.put([half, rollback, commit])
    assert store.queue_offsets("Real", 0) == (0, 1)
    assert [r.message_id for r in store.get("Real", 0, 0, 10).records] == ["id-Real-3"]
    assert store.find_by_unique_key("id-Real-1")[0].sys_flag == SysFlag.PREPARED


async def test_queries_by_unique_key_key_and_time(store: MessageStore) -> None:
    before = now_ms()
    await store.put([make_record(i, queue_id=i % 3) for i in range(12)])
    after = now_ms()
    assert [r.queue_id for r in store.find_by_unique_key("id-T-4")] == [1]
    assert store.find_by_unique_key("missing") == []
    assert [r.message_id for r in store.find_by_key("T", "k7")] == ["id-T-7"]
    assert store.find_by_key("Other", "k7") == []
    assert len(store.find_by_time("T", before, after, 100)) == 12
    assert store.find_by_time("T", after + 10, after + 20) == []


async def test_restart_keeps_messages_offsets_and_index(store_dir: Path) -> None:
    s = await MessageStore.open(small_config(store_dir))
    await s.put([make_record(i, queue_id=i % 4, size=3000) for i in range(100)])
    await s.close()
    s = await MessageStore.open(small_config(store_dir))
    assert [s.queue_offsets("T", q) for q in range(4)] == [(0, 25)] * 4
    assert len(s.log.segments) > 2
    assert s.find_by_unique_key("id-T-77")[0].body == bytes([77]) * 3000
    res = await s.put([make_record(500, queue_id=0)])
    assert res.appended[0].queue_offset == 25
    await s.close()


async def test_sync_flush_acks_after_fsync_and_batches(store_dir: Path) -> None:
    # the claim is group commit: a slow fsync on a loaded machine must not turn into BUSY
    # refusals (max_send_wait_ms, 200 ms by default; tested on its own below)
    s = await MessageStore.open(small_config(store_dir, flush=FlushMode.SYNC,
                                             max_send_wait_ms=60_000))
    results = await asyncio.gather(*(s.put([make_record(i)]) for i in range(300)))
    assert {r.status for r in results} == {PutStatus.OK}
    assert s.log.synced_offset >= max(r.appended[0].physical_offset for r in results)
    assert s.writer.stats["fsyncs"] < 300  # group commit: fsyncs shared by many records
    await s.close()


async def test_busy_when_queue_head_waited_too_long(store_dir: Path) -> None:
    s = await MessageStore.open(small_config(store_dir, max_send_wait_ms=0))
    wake = s.writer._wake
    wake.set = lambda: None  # type: ignore[method-assign]  # the writer is not woken
    first = asyncio.create_task(s.put([make_record(1)]))
    await asyncio.sleep(0.01)
    refused = await s.put([make_record(2)])
    assert refused.status == PutStatus.BUSY and "waited" in refused.message
    del wake.set  # back to the class's method
    wake.set()
    assert (await first).status == PutStatus.OK
    await s.close()


async def test_disk_full_refuses_and_keeps_data(store: MessageStore) -> None:
    await store.put([make_record(1)])
    store.disk.full = True
    res = await store.put([make_record(2)])
    assert res.status == PutStatus.DISK_FULL
    assert store.get("T", 0, 0, 10).records[0].message_id == "id-T-1"


async def test_record_larger_than_a_segment_is_refused(store: MessageStore) -> None:
    res = await store.put([make_record(1, size=70_000)])
    assert res.status == PutStatus.TOO_LARGE and store.log.write_offset == 0


async def test_retention_deletes_old_segments_but_honours_floors(store_dir: Path) -> None:
    s = await MessageStore.open(small_config(store_dir, file_reserved_hours=1))
    await s.put([make_record(i, queue_id=0, size=5000) for i in range(60)])
    segs = list(s.log.segments)
    assert len(segs) >= 4
    old = time.time() - 7200
    for seg in segs[:-1]:
        os.utime(seg.path, (old, old))
    s.set_retention_floor("scheduler", segs[2].start)  # must keep segment 2 onward
    assert await s.retention.run_once() == 2
    assert s.log.min_offset == segs[2].start
    lo, hi = s.queue_offsets("T", 0)
    assert lo > 0 and hi == 60
    res = s.get("T", 0, 0, 5)
    assert res.status == GetStatus.OFFSET_TOO_SMALL and res.records[0].queue_offset == lo
    s.floors.clear()
    assert await s.retention.run_once() == len(segs) - 3
    await s.close()


async def test_listener_hears_which_queues_grew(store: MessageStore) -> None:
    heard: list[set[tuple[str, int]]] = []
    store.add_listener(heard.append)
    await store.put([make_record(1, queue_id=2), make_record(2, topic="U", queue_id=0)])
    assert heard == [{("T", 2), ("U", 0)}]


async def test_consume_queue_agrees_with_commit_log(store: MessageStore) -> None:
    recs = [MessageRecord("Z", i % 3, os.urandom(50 + i), {"UNIQ_KEY": str(i)}) for i in range(90)]
    await store.put(recs)
    for q in range(3):
        got = store.get("Z", q, 0, 100).records
        assert [r.body for r in got] == [r.body for r in recs if r.queue_id == q]
        assert [r.queue_offset for r in got] == list(range(30))
