"""tidemq_server.common.broker_client against a real broker: the internal calls, the rows they carry
(tidemq.protocol.schedule) and how failures are told apart."""

from __future__ import annotations

import pickle
import time
from collections.abc import Iterator

import httpx
import msgpack
import pytest
from tidemq.protocol import UNIQ_KEY, DeliveryRow, SystemTopic

from tests.support.broker import TOKEN, BrokerHandle, run_broker, unique
from tests.support.clock import now_ms
from tests.support.procs import RedisServer, free_port
from tidemq_server.common.broker_client import (
    BlockingBrokerClient,
    BrokerClient,
    BrokerDown,
    BrokerRefused,
    _answer,
    deliver_body,
)

pytestmark = pytest.mark.integration

DAY_MS = 86_400_000


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory,
           redis_server: RedisServer) -> Iterator[BrokerHandle]:
    with run_broker(tmp_path_factory.mktemp("client"), redis_server.url) as handle:
        yield handle


@pytest.mark.parametrize("n", [0, 3, 15, 16, 300, 70_000])
def test_deliver_body_is_the_msgpack_of_its_parts(n: int) -> None:
    rows = [[f"t{i}", i] for i in range(n)]
    body = deliver_body([msgpack.packb(r) for r in rows], [1, 2])
    assert msgpack.unpackb(body) == {"records": rows, "strict": [1, 2]}


def test_errors_survive_pickling() -> None:
    down = pickle.loads(pickle.dumps(BrokerDown("gone", maybe_done=False)))
    assert str(down) == "gone" and down.maybe_done is False
    moved = pickle.loads(pickle.dumps(BrokerDown("moved", code="NOT_PRIMARY")))
    assert moved.code == "NOT_PRIMARY" and moved.maybe_done is True
    refused = pickle.loads(pickle.dumps(BrokerRefused(400, "BAD_REQUEST", "no")))
    assert (refused.status, refused.code, refused.message) == (400, "BAD_REQUEST", "no")


async def test_level_round_trip_through_the_rows(broker: BrokerHandle) -> None:
    """A delay-level message comes back from ``levels_due`` as a DueRecord whose DeliveryRow
    ``deliver`` stores in the real topic; integer map keys (queue ids) decode."""
    topic = broker.create_topic(queues=2)
    mid = unique("lvl")
    broker.send(topic, {"body": "late", "message_id": mid, "tag": "a", "delay_level": 1,
                        "queue_id": 1})
    client = BrokerClient(broker.url, TOKEN, user_agent="tidemq-test")
    try:
        info = await client.schedule_info()
        assert info["schedule_topic"] == SystemTopic.SCHEDULE
        answer = await client.levels_due({}, now_ms() + DAY_MS, 100)
        records = answer["levels"][0]["records"]  # an int key: queue id 0 = level 1
        (due,) = [r for r in records if r["message_id"] == mid]
        row = DeliveryRow._make(due["record"])
        assert (row.topic, row.queue_id, row.body) == (topic, 1, b"late")
        assert row.properties[UNIQ_KEY] == mid
        stored = await client.deliver(deliver_body([msgpack.packb(due["record"])], []))
        assert stored == {"stored": 1, "duplicates": 0}
    finally:
        await client.close()
    pulled = broker.pull(topic, 1)
    assert [(m["message_id"], m["body"], m["tag"]) for m in pulled["messages"]] == [
        (mid, "late", "a")]


async def test_refused_and_down_are_told_apart(broker: BrokerHandle) -> None:
    wrong = BrokerClient(broker.url, "not-the-token")
    try:
        with pytest.raises(BrokerRefused) as refused:
            await wrong.transactions_info()
        assert (refused.value.status, refused.value.code) == (401, "UNAUTHORIZED")
    finally:
        await wrong.close()
    nobody = BrokerClient(f"http://127.0.0.1:{free_port()}", TOKEN, timeout_s=2.0)
    try:
        with pytest.raises(BrokerDown) as down:
            await nobody.halves(0, 10)
        assert down.value.maybe_done  # no answer: the request may have been taken
    finally:
        await nobody.close()


async def test_transactions_and_retention_floor(broker: BrokerHandle) -> None:
    client = BrokerClient(broker.url, TOKEN)
    try:
        assert (await client.transactions_info())["broker_name"]
        page = await client.halves(0, 10)
        assert page["entries"] == []
        await client.retention_floor("test-owner", 0)
        with pytest.raises(BrokerRefused) as bad:
            await client.act([{"action": "explode"}])
        assert bad.value.status == 400
    finally:
        await client.close()


def test_blocking_client_reads_bodies_and_retries(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=1)
    broker.send(topic, {"body": "one"}, {"body": "two"})
    with_token = BlockingBrokerClient(broker.url, TOKEN)
    try:
        assert with_token.describe_topic(unique("missing")) is None
        offsets = with_token.describe_topic(topic)
        assert offsets is not None and offsets["offsets"][0]["max"] == 2
        answer = with_token.bodies(topic, 0, 0, 10)
        assert answer["bodies"] == [b"one", b"two"] and answer["offsets"] == [0, 1]
    finally:
        with_token.close()
    nobody = BlockingBrokerClient(f"http://127.0.0.1:{free_port()}", TOKEN, timeout_s=1.0,
                                  attempts=3, retry_base_s=0.05)
    began = time.monotonic()
    with pytest.raises(BrokerDown, match="attempt 3 of 3"):
        nobody.bodies(topic, 0, 0, 10)
    assert time.monotonic() - began >= 0.15  # backed off 0.05 s, then 0.1 s
    nobody.close()


@pytest.mark.parametrize(("code", "maybe_done"), [
    ("NOT_ENOUGH_REPLICAS", True), ("NOT_PRIMARY", True), ("BROKER_BUSY", False),
    ("UNAVAILABLE", False)])
def test_a_503_after_the_write_may_have_taken_effect(code: str, maybe_done: bool) -> None:
    """A replicated primary answers NOT_ENOUGH_REPLICAS (or NOT_PRIMARY, its fence shut) after
    the records were written: the scheduler then retries strict. Taking them for "nothing done"
    delivered timers twice across failovers (found by the faults suite)."""
    resp = httpx.Response(503, json={"code": code, "message": "m"})
    with pytest.raises(BrokerDown) as down:
        _answer("deliver", resp)
    assert down.value.maybe_done is maybe_done
