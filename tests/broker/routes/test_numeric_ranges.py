"""Numbers past the width the store keeps them in are refused where they enter, naming the field,
and a broker whose store writer stopped says so on /healthz and /metrics.

The first report: one internal write with ``reconsume_times`` 2147483648 made the group-commit
writer fail (``'i' format requires ...``); the failure is sticky by design, so every later send
answered 503 until a restart, while /healthz said ok.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from tests.support.broker import TOKEN, BrokerHandle, run_broker, unique
from tests.support.procs import RedisServer

pytestmark = pytest.mark.integration

AUTH = {"X-Tidemq-Token": TOKEN}
I32_MAX = 2**31 - 1
I64_MAX = 2**63 - 1
# a JSON integer past 64 bits (orjson decodes it as a float): it must read as out of range
HUGE = "1180591620717411303424"  # 2**70


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory,
           redis_server: RedisServer) -> Iterator[BrokerHandle]:
    with run_broker(tmp_path_factory.mktemp("ranges"), redis_server.url) as handle:
        yield handle


def metric(b: BrokerHandle, name: str) -> float:
    for line in b.http.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def internal_put(b: BrokerHandle, topic: str, **fields: Any) -> Any:
    return b.http.post(f"/internal/v1/topics/{topic}/messages", headers=AUTH,
                       json={"records": [{"body": "x", **fields}]})


def raw_send(b: BrokerHandle, topic: str, message_json: str) -> Any:
    return b.http.post(f"/v1/topics/{topic}/messages",
                       content=f'{{"messages": [{message_json}]}}',
                       headers={"content-type": "application/json"})


def assert_writer_healthy(b: BrokerHandle, topic: str) -> None:
    assert b.http.get("/healthz").json() == {"status": "ok"}
    assert metric(b, "tidemq_broker_store_writer_failed") == 0.0
    assert b.send(topic, {"body": "still writable"})[0]["queue_offset"] >= 0


def test_internal_reconsume_times_past_i32_is_400_and_the_writer_keeps_going(
        broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=1)
    message = broker.error(internal_put(broker, topic, reconsume_times=I32_MAX + 1), 400,
                           "BAD_REQUEST")
    assert "reconsume_times" in message and str(I32_MAX) in message
    assert_writer_healthy(broker, topic)
    ok = internal_put(broker, topic, reconsume_times=I32_MAX)  # the edge itself is stored
    assert ok.status_code == 200, ok.text
    (back,) = broker.pull(topic, 0, offset=1)["messages"]
    assert back["reconsume_times"] == I32_MAX


@pytest.mark.parametrize(("field", "value"), [
    ("queue_id", I32_MAX + 1), ("queue_id", -1), ("flag", I32_MAX + 1), ("sys_flag", -1),
    ("sys_flag", 2**40), ("born_timestamp_ms", -1), ("born_timestamp_ms", I64_MAX + 1),
    ("reconsume_times", -1), ("prepared_tx_offset", I64_MAX + 1), ("tag_code", -(2**63) - 1),
    ("reconsume_times", True), ("born_host", "10.0.0.1:99999999999"),
])
def test_every_internal_record_field_is_checked_against_its_slot(
        broker: BrokerHandle, field: str, value: Any) -> None:
    topic = broker.create_topic(queues=1)
    message = broker.error(internal_put(broker, topic, **{field: value}), 400, "BAD_REQUEST")
    assert f"records[0].{field}" in message, message
    assert_writer_healthy(broker, topic)


def test_a_json_integer_past_64_bits_is_out_of_range_not_a_float(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=1)
    resp = broker.http.post(f"/internal/v1/topics/{topic}/messages",
                            content=f'{{"records": [{{"body": "x", "reconsume_times": {HUGE}}}]}}',
                            headers={**AUTH, "content-type": "application/json"})
    message = broker.error(resp, 400, "BAD_REQUEST")
    assert "reconsume_times" in message and "beyond 64 bits" in message
    delayed = broker.error(raw_send(broker, topic, f'{{"body": "x", "delay_ms": {HUGE}}}'),
                           400, "INVALID_DELAY")
    assert "delay_ms" in delayed and "2592000000" in delayed and "float" not in delayed
    at = broker.error(raw_send(broker, topic, f'{{"body": "x", "deliver_at_ms": {HUGE}}}'),
                      400, "INVALID_DELAY")
    assert "deliver_at_ms" in at and "maximum delay" in at
    queue = broker.error(raw_send(broker, topic, f'{{"body": "x", "queue_id": {HUGE}}}'),
                         400, "BAD_REQUEST")
    assert "queue_id" in queue
    assert_writer_healthy(broker, topic)


def test_a_delivery_row_past_its_slots_fails_alone(broker: BrokerHandle) -> None:
    """The scheduler's deliver endpoint takes rows as they come (a trusted, hot path): the
    store's own check before queueing a write refuses the row and names the field."""
    topic = broker.create_topic(queues=1)
    row = [topic, 0, b"late", {"UNIQ_KEY": unique("row")}, 0, 0, 1, "127.0.0.1:0",
           I32_MAX + 1, 0]
    resp = broker.http.post("/internal/v1/schedule/deliver",
                            content=msgpack.packb({"records": [row]}, use_bin_type=True),
                            headers={**AUTH, "content-type": "application/msgpack",
                                     "accept": "application/msgpack"})
    assert "reconsume_times" in broker.error(resp, 400, "BAD_REQUEST")  # errors are JSON
    assert_writer_healthy(broker, topic)


def test_transaction_numbers_are_checked(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=1)
    group = unique("pg")
    resp = broker.http.post("/v1/transactions", json={
        "producer_group": group, "topic": topic, "message": {"body": "x"},
        "check_immunity_s": 1e300})
    assert "check_immunity_s" in broker.error(resp, 400, "BAD_REQUEST")
    resp = broker.http.post("/v1/transactions", content=(
        f'{{"producer_group": "{group}", "topic": "{topic}", '
        f'"message": {{"body": "x", "delay_level": {HUGE}}}}}'),
        headers={"content-type": "application/json"})
    assert "delay_level" in broker.error(resp, 400, "INVALID_DELAY")
    resp = broker.http.post("/internal/v1/transactions/actions", headers=AUTH, json={
        "actions": [{"transaction_id": "t", "physical_offset": True, "action": "check"}]})
    assert "physical_offset" in broker.error(resp, 400, "BAD_REQUEST")
    assert_writer_healthy(broker, topic)


def test_internal_offsets_past_64_bits_are_400_not_500(broker: BrokerHandle) -> None:
    """An offset the answer would echo back must fit JSON's 64-bit integers (it used to fail
    while encoding the answer: a 500)."""
    intake = broker.http.get("/internal/v1/schedule/intake", params={"offset": 2**70},
                             headers=AUTH)
    assert "offset" in broker.error(intake, 400, "BAD_REQUEST")
    floor = broker.http.post("/internal/v1/retention-floor", headers=AUTH,
                             json={"owner": unique("o"), "physical_offset": I64_MAX + 1})
    assert "physical_offset" in broker.error(floor, 400, "BAD_REQUEST")
    assert broker.http.get("/healthz").json() == {"status": "ok"}


# --- a writer that stopped ---------------------------------------------------------------------

SEGMENT = 64 * 1024


def test_a_stopped_writer_fails_healthz_and_metrics_say_so(tmp_path: Path,
                                                            redis_server: RedisServer) -> None:
    """The next commit log segment cannot be created (a directory sits where its file goes):
    the roll fails inside the writer, which stops for good. Health must stop saying ok."""
    with run_broker(tmp_path, redis_server.url, segment_bytes=SEGMENT) as b:
        topic = b.create_topic(queues=1)
        segments = b.data_dir / "store" / "commitlog"
        (segments / f"{SEGMENT:020d}").mkdir()
        assert b.http.get("/healthz").status_code == 200
        body = "x" * 8000
        failed = None
        for _ in range(16):  # 16 messages of 8 KB fill more than one 64 KiB segment: a roll is due
            resp = b.http.post(f"/v1/topics/{topic}/messages",
                               json={"messages": [{"body": body}]})
            if resp.status_code != 200:
                failed = resp
                break
        assert failed is not None, "the writer never had to roll"
        # the failing batch may be partly on disk: 500 (retry here), not 503 (go elsewhere)
        b.error(failed, 500, "INTERNAL_ERROR")
        health = b.http.get("/healthz")
        message = b.error(health, 503, "UNAVAILABLE")
        assert "store writer stopped" in message and "Is a directory" in message
        assert metric(b, "tidemq_broker_store_writer_failed") == 1.0
        b.error(b.http.post(f"/v1/topics/{topic}/messages", json={"messages": [{"body": "y"}]}),
                503, "UNAVAILABLE")
        time.sleep(0.1)
        assert "store writer failed" in b.proc.logs()
