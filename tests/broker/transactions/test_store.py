"""Transaction state from the store alone (what a restarted broker sees): records, op records,
a torn tail between a commit copy and its op record; and the event body's fixed schema."""

from __future__ import annotations

import json
from pathlib import Path

from tidemq.protocol import KEYS, EventKind, EventSource

from tidemq_server.broker.store import MessageStore, StoreConfig
from tidemq_server.broker.store.types import MessageRecord
from tidemq_server.broker.transactions.model import (
    HALF_TOPIC,
    TxInfo,
    TxState,
    commit_copy,
    decode_op,
    event_record,
    half_copy,
    op_records,
)
from tidemq_server.broker.transactions.table import TxTable


def half_record(txid: str, mid: str) -> MessageRecord:
    return MessageRecord(topic=HALF_TOPIC, queue_id=0, body=b"body", born_timestamp=5,
                         properties={"UNIQ_KEY": mid, KEYS: f"user-key\x1f{txid}",
                                     "TRANSACTION_ID": txid, "REAL_TOPIC": "Orders",
                                     "REAL_QID": "2", "PGROUP": "g", "TRAN_MSG": "true",
                                     "BORN_MS": "5", "TAGS": "TagA", "color": "red"})


async def test_state_is_rebuilt_from_records(store_dir: Path) -> None:
    store = await MessageStore.open(StoreConfig(root=store_dir))
    try:
        for i in range(4):
            await store.put([half_record(f"tx{i}", f"m{i}")])
        first = store.find_by_key(HALF_TOPIC, "tx0")[0]
        await store.put([half_copy(first, 1), half_copy(first, 2)])  # two checks of tx0
        info1 = TxTable(store, 10).ensure("tx1")
        assert info1 is not None
        await store.put([commit_copy(store.read(info1.first_offset), info1, 0),  # type: ignore[arg-type]
                         *op_records([("tx1", "commit", "producer"), ("tx2", "rollback",
                                                                      "check")], 9)])
        info3 = TxTable(store, 10).ensure("tx3")
        assert info3 is not None
        # tx3: the commit copy was written, the op record torn off by a crash
        await store.put([commit_copy(store.read(info3.first_offset), info3, 0)])  # type: ignore[arg-type]

        fresh = TxTable(store, 10)  # a restarted broker: nothing in memory
        states = {t: fresh.ensure(t).state for t in ("tx0", "tx1", "tx2", "tx3")}  # type: ignore[union-attr]
        assert states == {"tx0": TxState.HALF, "tx1": TxState.COMMITTED,
                          "tx2": TxState.ROLLED_BACK, "tx3": TxState.COMMITTED}
        tx0 = fresh.get("tx0")
        assert tx0 is not None and tx0.check_times == 2 and tx0.latest_offset > tx0.first_offset
        assert (tx0.group, tx0.topic, tx0.message_id, tx0.born_ms) == ("g", "Orders", "m0", 5)
        assert fresh.ensure("nope") is None
        assert [i.txid for i in fresh.pending("g")] == ["tx0"]
    finally:
        await store.close()


async def test_a_commit_copy_above_the_high_water_mark_does_not_end_the_transaction(
        store_dir: Path) -> None:
    """A commit written but answered NOT_ENOUGH_REPLICAS may be cut by a failover: taken for
    "committed", the checker stopped checking the transaction and its commit was lost (found
    by the faults suite). Only what a quorum holds ends it."""
    store = await MessageStore.open(StoreConfig(root=store_dir))
    try:
        await store.put([half_record("txU", "mU")])
        info = TxTable(store, 10).ensure("txU")
        assert info is not None
        res = await store.put([commit_copy(store.read(info.first_offset), info, 0)])  # type: ignore[arg-type]
        store.visible_offset = res.appended[0].physical_offset  # the copy is above the HWM
        unsettled = TxTable(store, 10).ensure("txU")
        assert unsettled is not None and unsettled.state is TxState.HALF  # checks go on
        store.visible_offset = None  # a quorum holds it now
        settled = TxTable(store, 10).ensure("txU")
        assert settled is not None and settled.state is TxState.COMMITTED
    finally:
        await store.close()


async def test_a_load_that_saw_below_the_high_water_mark_is_done_again_when_it_moves(
        store_dir: Path) -> None:
    """A promoted replica loads its transactions while its high-water mark still lags its
    log: the newest copy of a half message, and an op record, may lie above it. Once a quorum
    holds them the table must know them, not answer from the older copy for ever (a decision
    on the newest copy was refused as ``superseded`` and the checks stopped)."""
    store = await MessageStore.open(StoreConfig(root=store_dir))
    try:
        await store.put([half_record("txC", "mC"), half_record("txE", "mE")])
        first = store.find_by_key(HALF_TOPIC, "txC")[0]
        rechecked = await store.put([half_copy(first, 1)])
        ended = await store.put(op_records([("txE", "rollback", "check")], 9))
        store.visible_offset = rechecked.appended[0].physical_offset  # both above the HWM
        table = TxTable(store, 10)
        seen = table.ensure("txC")
        assert seen is not None and (seen.latest_offset, seen.check_times) == (
            first.physical_offset, 0)
        assert table.ensure("txE").state is TxState.HALF  # type: ignore[union-attr]
        store.visible_offset = ended.appended[0].physical_offset  # the copy is held now
        again = table.ensure("txC")
        assert again is seen  # the same entry, brought up to date
        assert (again.latest_offset, again.check_times) == (
            rechecked.appended[0].physical_offset, 1)
        assert table.ensure("txE").state is TxState.HALF  # type: ignore[union-attr]
        store.visible_offset = None  # and the op record
        assert table.ensure("txE").state is TxState.ROLLED_BACK  # type: ignore[union-attr]
        assert [i.txid for i in table.pending()] == ["txC"]
    finally:
        await store.close()


async def test_commit_copy_is_the_message_in_its_real_queue(store_dir: Path) -> None:
    store = await MessageStore.open(StoreConfig(root=store_dir))
    try:
        await store.put([half_record("txA", "mA")])
        half = store.find_by_key(HALF_TOPIC, "txA")[0]
        info = TxTable(store, 10).ensure("txA")
        assert info is not None
        rec = commit_copy(half, info, 77)
        assert (rec.topic, rec.queue_id, rec.sys_flag, rec.tag_code) == ("Orders", 2, 0x8, 77)
        assert rec.prepared_tx_offset == half.physical_offset
        assert rec.properties[KEYS] == "user-key"  # the transaction id is not a user key
        assert "REAL_TOPIC" not in rec.properties and rec.properties["color"] == "red"
        assert rec.properties["TRANSACTION_ID"] == "txA"  # kept (hidden from clients)
    finally:
        await store.close()


def test_op_records_batch_ends_and_key_the_uncommitted_ones() -> None:
    entries = [(f"t{i}", "commit" if i % 3 else "rollback", "producer") for i in range(600)]
    records = op_records(entries, 1)
    assert len(records) == 2  # 512 ends per op record
    assert records[0].properties[KEYS].split("\x1f")[:3] == ["t0", "t3", "t6"]
    decoded = [e for r in records for e in decode_op(r)]  # type: ignore[arg-type]
    assert decoded == entries
    only_commits = op_records([("c", "commit", "check")], 1)[0]
    assert KEYS not in only_commits.properties  # found by its commit copy instead


def test_event_body_has_the_fixed_schema() -> None:
    info = TxInfo("tx", "mid", "grp", "Orders", 0, 0, 0, 3, 1000)
    rec = event_record(EventKind.CHECK, EventSource.CHECK, info, 2000)
    assert json.loads(rec.body) == {
        "event": "check", "source": "check", "producer_group": "grp", "topic": "Orders",
        "transaction_id": "tx", "message_id": "mid", "check_times": 3, "born_ms": 1000,
        "ts_ms": 2000}
    assert rec.topic == "TIDE_SYS_TRANS_EVENTS"


def test_decode_op_ignores_junk() -> None:
    class Junk:
        body = b"\xc1 not msgpack"

    assert decode_op(Junk()) == []  # type: ignore[arg-type]


async def test_half_dedup_remembers_within_the_window_and_falls_back_to_the_index(
        store_dir: Path) -> None:
    from tidemq_server.broker.transactions.table import HalfDedup

    store = await MessageStore.open(StoreConfig(root=store_dir))
    try:
        dedup = HalfDedup(store, window_ms=1000, max_entries=2, started_ms=0)
        dedup.remember("Orders", "m1", "tx1", 10_000)
        assert dedup.lookup("Orders", "m1", 10_500) == ("tx1", 0)  # remembered: acknowledged
        assert dedup.lookup("Other", "m1", 10_500) is None
        assert dedup.lookup("Orders", "m1", 11_001) is None  # past the window
        dedup.remember("Orders", "m2", "tx2", 11_000)
        dedup.remember("Orders", "m3", "tx3", 11_100)
        dedup.remember("Orders", "m4", "tx4", 11_200)  # evicts m2, still inside the window
        assert dedup.lookup("Orders", "m4", 11_300) == ("tx4", 0)
        # m2 was evicted young: now the index is asked, and it holds no half for m2
        assert dedup.lookup("Orders", "m2", 11_300) is None
        earlier = half_record("txS", "mS")  # a half stored by "an earlier run"
        earlier.properties["BORN_MS"] = "11000"
        res = await store.put([earlier])
        end = res.appended[0].physical_offset + res.appended[0].size
        # found in the log: its end comes along, for the caller to settle (quorum, primary)
        assert dedup.lookup("Orders", "mS", 11_300) == ("txS", end)
        assert dedup.lookup("Orders", "mS", 12_500) is None  # too old to be a retry
    finally:
        await store.close()


async def test_a_half_from_a_producer_batch_is_rebuilt_from_the_log(store_dir: Path) -> None:
    """A half stored as the producer's batch (record format 2, no BORN_MS): a restarted
    broker loads it through the index by its transaction id, born when it was stored, and a
    re-put copy (a check) keeps that birth."""
    from tidemq._batch import encode_halves
    from tidemq.protocol import OutgoingMessage
    from tidemq.protocol.records.v2_read import validate

    from tidemq_server.broker.store.records.v2_own import Batch

    store = await MessageStore.open(StoreConfig(root=store_dir))
    try:
        msg = OutgoingMessage(body=b"body", message_id="mB", queue_id=1, keys=["user-key"])
        raw = encode_halves("g", "Orders", 3, [msg], ["txB"], 7)
        res = await store.writer.append_batches([Batch(raw, validate(raw, strict=False))])
        stored_ms = res.appended[0].store_timestamp
        fresh = TxTable(store, 10)  # a restarted broker: nothing in memory
        info = fresh.ensure("txB")
        assert info is not None and info.state is TxState.HALF
        assert (info.group, info.topic, info.message_id, info.born_ms) == \
            ("g", "Orders", "mB", stored_ms)
        first = store.read(info.first_offset)
        assert first is not None
        await store.put([half_copy(first, 1)])  # a check, stored later
        again = TxTable(store, 10).ensure("txB")
        assert again is not None and again.check_times == 1
        assert again.latest_offset > again.first_offset and again.born_ms == stored_ms
        copy = store.read(again.latest_offset)
        assert copy is not None and copy.properties["BORN_MS"] == str(stored_ms)
        committed = commit_copy(copy, again, 0)
        assert (committed.queue_id, committed.properties["KEYS"]) == (1, "user-key")
    finally:
        await store.close()


async def test_a_commit_copy_from_the_stored_half_is_found_after_a_restart(
        store_dir: Path) -> None:
    """A commit copy written from its half's stored bytes (``CommitCopies``), its op record
    torn off: a restarted broker counts the transaction committed (the copy is indexed by its
    message id) and reads the copy the decode-and-encode path would have written."""
    from tidemq._batch import encode_halves
    from tidemq.protocol import OutgoingMessage
    from tidemq.protocol.message import DEFAULT_LIMITS

    from tidemq_server.broker.ingest.halves import parse_halves
    from tidemq_server.broker.store.records.v2_own import Batch
    from tidemq_server.broker.store.types import SysFlag
    from tidemq_server.broker.transactions.batches import CommitCopies

    store = await MessageStore.open(StoreConfig(root=store_dir))
    try:
        msg = OutgoingMessage(body=b"body", message_id="mC", queue_id=2, keys=["user-key"],
                              tag="TagA", properties={"color": "red"})
        raw = encode_halves("g", "Orders", 3, [msg], ["txC"], 7)
        summaries, [half] = parse_halves("g", "Orders", raw, 4, DEFAULT_LIMITS)
        await store.writer.append_batches([Batch(raw, summaries[0])])
        half.host = "10.1.2.3:4567"
        info = TxTable(store, 10).ensure("txC")
        assert info is not None and info.state is TxState.HALF
        copies = CommitCopies(1 << 20)
        copies.add(half, info)
        await store.writer.append_batches(copies.batches())

        fresh = TxTable(store, 10)  # a restarted broker: nothing in memory
        assert fresh.ensure("txC").state is TxState.COMMITTED  # type: ignore[union-attr]
        [got] = [r for r in store.find_by_unique_key("mC") if r.topic == "Orders"]
        want = commit_copy(half.record(), info, 0)
        assert (got.queue_id, got.sys_flag & int(SysFlag.TYPE_MASK), got.prepared_tx_offset,
                got.body, got.born_timestamp, got.born_host, got.tag, got.keys) == \
            (2, int(SysFlag.COMMIT), info.first_offset, b"body", half.born_timestamp,
             "10.1.2.3:4567", "TagA", ["user-key"])
        assert got.properties == want.properties
        assert "REAL_TOPIC" not in got.properties and got.properties["color"] == "red"
    finally:
        await store.close()
