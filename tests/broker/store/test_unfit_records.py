"""A record whose fields the layout cannot hold fails its own put and never stops the writer.

A field past its slot (e.g. reconsume_times 2**31 in an i32) raised inside the writer task
would make the failure sticky: every later put would answer UNAVAILABLE until a restart. So
``put`` packs each header once, before the record can reach a batch.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from tests.broker.store.conftest import make_record
from tidemq_server.broker.store import MessageStore, PutStatus
from tidemq_server.broker.store.records.v1 import FIELD_RANGES, UnfitRecord, validate_fits


@pytest.mark.parametrize(("field", "value"), [
    ("reconsume_times", 2**31), ("queue_id", -(2**31) - 1), ("flag", 2**31),
    ("sys_flag", 2**40), ("born_timestamp", 2**63), ("prepared_tx_offset", -(2**63) - 1),
    ("tag_code", 2**64), ("reconsume_times", 1.5),
])
async def test_an_unfit_record_fails_its_own_put_only(store: MessageStore, field: str,
                                                      value: object) -> None:
    bad = make_record(1)
    setattr(bad, field, value)
    good = [make_record(i) for i in range(2, 6)]
    # the bad put and good ones are queued together, as one batch of the writer would take them
    results = await asyncio.gather(store.put([make_record(0), bad]), store.put(good),
                                   store.put([make_record(6)]))
    assert results[0].status is PutStatus.INVALID
    assert field in results[0].message and str(FIELD_RANGES[field][1]) in results[0].message
    assert [r.status for r in results[1:]] == [PutStatus.OK, PutStatus.OK]
    assert store.failure is None and store.stats()["writer_failed"] == 0.0
    later = await store.put([make_record(7)])
    assert later.status is PutStatus.OK
    # nothing of the refused request was stored: the queue holds the 4 + 1 + 1 good records
    got = store.get("T", 0, 0, 100)
    assert [r.message_id for r in got.records] == [f"id-T-{i}" for i in (2, 3, 4, 5, 6, 7)]


async def test_a_born_host_port_past_its_slot_is_named(store: MessageStore) -> None:
    bad = dataclasses.replace(make_record(1), born_host=f"10.0.0.1:{2**32}")
    with pytest.raises(UnfitRecord, match="born_host"):
        validate_fits(bad)
    result = await store.put([bad])
    assert result.status is PutStatus.INVALID and "born_host" in result.message
    assert (await store.put([make_record(2)])).status is PutStatus.OK


async def test_a_record_at_the_edges_of_every_slot_is_stored_and_read_back(
        store: MessageStore) -> None:
    edges = {name: high for name, (_, high) in FIELD_RANGES.items() if name != "queue_id"}
    rec = make_record(1)
    for name, value in edges.items():
        setattr(rec, name, value)
    validate_fits(rec)
    result = await store.put([rec])
    assert result.status is PutStatus.OK
    back = store.read(result.appended[0].physical_offset)
    assert back is not None
    assert (back.reconsume_times, back.prepared_tx_offset, back.born_timestamp) == (
        2**31 - 1, 2**63 - 1, 2**63 - 1)
