"""A replicated member cuts its log before damaged records and copies them back from its
primary (replication/recopy.py); it may not lead until its log is whole again."""

from __future__ import annotations

from pathlib import Path

from tests.broker.store.conftest import make_record, small_config
from tidemq_server.broker.replication.epochs import EpochFile
from tidemq_server.broker.replication.recopy import recopy_damaged
from tidemq_server.broker.replication.role import BrokerRole, Role
from tidemq_server.broker.store import MessageStore


async def test_damaged_records_are_cut_then_copied_back_whole(tmp_path: Path) -> None:
    primary = await MessageStore.open(small_config(tmp_path / "primary"))
    replica = await MessageStore.open(small_config(tmp_path / "replica"))
    try:
        await primary.put([make_record(i, queue_id=0) for i in range(7)])
        entry = primary.log.write_offset  # the second write's batch starts here
        result = await primary.put([make_record(i, queue_id=0) for i in range(7, 20)])
        replica.append_replicated(primary.read_chunk(0, 1 << 20), 0)
        end = replica.log.write_offset
        bad = result.appended[3]
        # what recovery lists for a record of that batch whose bytes failed their CRC
        replica.log.skipped = [(bad.physical_offset, bad.size)]
        replica.log.damaged_at = [entry]
        role = BrokerRole(EpochFile(tmp_path / "epochs.json"), "http://127.0.0.1:1",
                          lambda: replica.log.write_offset, Role.REPLICA,
                          primary_address="http://127.0.0.1:2")
        assert role.may_lead()
        removed = await recopy_damaged(replica, role)
        assert removed == end - entry
        assert replica.log.write_offset == entry
        assert replica.log.skipped == [] and replica.log.damaged_at == []
        assert replica.queue_offsets("T", 0) == (0, 7)
        assert not role.may_lead()  # shorter than before the cut: not a candidate
        # the follower copies the rest again from the primary, at the same offsets
        replica.append_replicated(primary.read_chunk(entry, 1 << 20), entry)
        assert role.may_lead()
        got = replica.get("T", 0, 0, 100).records
        assert [r.message_id for r in got] == [f"id-T-{i}" for i in range(20)]
    finally:
        await primary.close()
        await replica.close()


async def test_an_undamaged_log_is_left_alone(tmp_path: Path) -> None:
    store = await MessageStore.open(small_config(tmp_path / "s"))
    try:
        await store.put([make_record(i) for i in range(5)])
        role = BrokerRole(EpochFile(tmp_path / "epochs.json"), "http://127.0.0.1:1",
                          lambda: store.log.write_offset, Role.REPLICA,
                          primary_address="http://127.0.0.1:2")
        end = store.log.write_offset
        assert await recopy_damaged(store, role) == 0
        assert store.log.write_offset == end and role.may_lead()
    finally:
        await store.close()
