"""A store written in record format version 1 (data/v1-store.tar.gz, see v1_store.py) recovers and
serves every record: as it was closed, with its derived files lost, and with a torn tail. It
must keep passing once the writer writes format v2 (issue 23)."""

from __future__ import annotations

import shutil
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.broker.store.conftest import small_config
from tests.broker.store.v1_store import ARCHIVE, SPEC, Spec
from tidemq_server.broker.store import MessageStore, StoredRecord, SysFlag, tag_code

ORDERS = [s for s in SPEC if s.topic == "Orders"]
LOG_END = 196_608 + 16_225  # where the archived log ends (its last segment's start + length)


def same(rec: StoredRecord, spec: Spec, queue_offset: int | None) -> None:
    props = dict(spec.user_properties, UNIQ_KEY=spec.message_id)
    if spec.tag:
        props["TAGS"] = spec.tag
    if spec.keys:
        props["KEYS"] = "\x1f".join(spec.keys)
    assert (rec.topic, rec.queue_id, rec.message_id, rec.body, rec.properties) == (
        spec.topic, spec.queue_id, spec.message_id, spec.body, props)
    assert (rec.tag, rec.keys, rec.flag, rec.sys_flag, rec.reconsume_times) == (
        spec.tag, spec.keys, spec.i % 4, spec.sys_flag, spec.i % 3)
    assert (rec.born_timestamp, rec.born_host) == (1_767_225_600_000 + spec.i,
                                                   "192.168.1.2:5555")
    if queue_offset is not None:
        assert rec.queue_offset == queue_offset


@pytest.fixture(params=["as closed", "derived files lost", "torn tail"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MessageStore]:
    with tarfile.open(ARCHIVE) as tar:
        tar.extractall(tmp_path, filter="data")
    root = tmp_path / "store"
    if request.param == "derived files lost":
        for gone in ("consumequeue", "index"):
            shutil.rmtree(root / gone)
        (root / "checkpoint").unlink()
    elif request.param == "torn tail":  # half a record written when the process died
        last = sorted((root / "commitlog").iterdir())[-1]
        first = (root / "commitlog" / "00000000000000000000").read_bytes()
        with last.open("ab") as f:
            f.write(first[:150])
    s = await MessageStore.open(small_config(root))
    yield s
    await s.close()


async def test_every_record_is_served_from_its_queue(store: MessageStore) -> None:
    assert store.log.write_offset == LOG_END
    for qid in range(3):
        want = [s for s in ORDERS if s.queue_id == qid]
        got = store.get("Orders", qid, 0, 1000).records
        assert len(got) == len(want) and store.queue_offsets("Orders", qid) == (0, len(want))
        for offset, (rec, spec) in enumerate(zip(got, want, strict=True)):
            same(rec, spec, offset)


async def test_tags_keys_ids_and_halves_are_found(store: MessageStore) -> None:
    paid = store.get("Orders", 1, 0, 1000, frozenset({tag_code("Paid")})).records
    assert [r.message_id for r in paid] == [
        s.message_id for s in ORDERS if s.queue_id == 1 and s.tag == "Paid"]
    keyed = store.find_by_key("Orders", "user-7")
    assert sorted(r.message_id for r in keyed) == [s.message_id for s in ORDERS if s.keys]
    for spec in (SPEC[0], SPEC[5], SPEC[161]):  # halves get no queue unit, only the index
        (rec,) = store.find_by_unique_key(spec.message_id)
        same(rec, spec, None if spec.sys_flag else rec.queue_offset)
    assert SPEC[5].sys_flag == int(SysFlag.PREPARED)
    assert store.queue_ids("RMQ_SYS_TRANS_HALF_TOPIC") == []
