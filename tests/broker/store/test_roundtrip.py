"""Property test: random batches in → the same bytes out, offsets monotonic, queues agree."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.broker.store.conftest import small_config
from tidemq_server.broker.store import MessageRecord, MessageStore

records = st.builds(
    lambda topic, qid, body, props, tag: (topic, qid, body, props, tag),
    st.sampled_from(["A", "B", "%RETRY%g"]),
    st.integers(0, 3),
    st.binary(max_size=3000),
    st.dictionaries(st.text("abcxyz", min_size=1, max_size=5),
                    st.text(st.characters(blacklist_characters="\x00\x01\x02\x1f",
                                          blacklist_categories=["Cs"]), max_size=20),
                    max_size=4),
    st.integers(0, 2**40),
)
batches = st.lists(st.lists(records, min_size=1, max_size=20), min_size=1, max_size=8)


#: flow control off: on a loaded machine a queue head can wait past the default 200 ms, and a
#: BUSY answer (nothing appended) is not what this property is about
NO_FLOW_CONTROL = {"max_send_wait_ms": 60_000}


async def _exercise(root: Path, plan: list[list[tuple]], reopen: bool) -> None:
    store = await MessageStore.open(small_config(root, **NO_FLOW_CONTROL))
    expected: dict[tuple[str, int], list[tuple[bytes, dict[str, str]]]] = {}
    results = []
    for i, batch in enumerate(plan):
        recs = []
        for j, (topic, qid, body, props, tag) in enumerate(batch):
            props = {**props, "UNIQ_KEY": f"{i}-{j}"}
            recs.append(MessageRecord(topic, qid, body, props, tag_code=tag))
            expected.setdefault((topic, qid), []).append((body, props))
        results.append(store.put(recs))
    done = await asyncio.gather(*results)
    assert all(len(r.appended) == len(b) for r, b in zip(done, plan, strict=True)), done
    physical = [a.physical_offset for r in done for a in r.appended]
    assert len(set(physical)) == len(physical)
    for key in expected:  # in the log, each queue's records come in the order they were put
        mine = [a.physical_offset for r, batch in zip(done, plan, strict=True)
                for a, rec in zip(r.appended, batch, strict=True) if rec[:2] == key]
        assert mine == sorted(mine)
    if reopen:
        await store.close()
        store = await MessageStore.open(small_config(root, **NO_FLOW_CONTROL))
    for (topic, qid), want in expected.items():
        got = store.get(topic, qid, 0, 1000).records
        assert [(r.body, r.properties) for r in got] == want
        assert [r.queue_offset for r in got] == list(range(len(want)))
        assert store.queue_offsets(topic, qid) == (0, len(want))
    await store.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=batches, reopen=st.booleans())
def test_random_batches_round_trip(plan: list[list[tuple]], reopen: bool) -> None:
    with tempfile.TemporaryDirectory() as d:
        asyncio.run(_exercise(Path(d), plan, reopen))
