"""Requests that used to be accepted loosely, on a real broker: a bool as a queue count, a topic
shrunk over queues that still hold messages, a transaction end without its producer group."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.broker import BrokerHandle, run_broker, unique
from tests.support.procs import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory,
           redis_server: RedisServer) -> Iterator[BrokerHandle]:
    with run_broker(tmp_path_factory.mktemp("loose"), redis_server.url) as handle:
        yield handle


def put_topic(b: BrokerHandle, name: str, **body: Any) -> Any:
    return b.http.put(f"/v1/topics/{name}", json=body)


@pytest.mark.parametrize("queues", [True, False, "8", 4.0])
def test_a_queue_count_must_be_a_real_integer(broker: BrokerHandle, queues: Any) -> None:
    name = unique("T")
    assert "queues" in broker.error(put_topic(broker, name, queues=queues), 400, "BAD_REQUEST")
    assert broker.http.get(f"/v1/topics/{name}").status_code == 404  # nothing created


def test_shrinking_over_queues_that_hold_messages_is_refused(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=6)
    broker.send(topic, {"body": "a", "queue_id": 1}, {"body": "b", "queue_id": 4},
                {"body": "c", "queue_id": 4})
    message = broker.error(put_topic(broker, topic, queues=3), 409, "QUEUES_NOT_EMPTY")
    assert "4" in message and "2 message(s)" in message and "6 to 3" in message
    assert broker.http.get(f"/v1/topics/{topic}").json()["queues"] == 6
    assert [m["body"] for m in broker.pull(topic, 4)["messages"]] == ["b", "c"]  # still there
    # dropping only empty queues is fine; growing always is
    assert put_topic(broker, topic, queues=5).json()["queues"] == 5
    assert put_topic(broker, topic, queues=7).json()["queues"] == 7
    # a perm change alone keeps the queue count (it used to fall back to the broker's default)
    changed = put_topic(broker, topic, perm="r")
    assert changed.status_code == 200 and changed.json() == {"name": topic, "queues": 7,
                                                               "perm": "r"}


def test_a_transaction_end_needs_its_producer_group(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=1)
    group = unique("pg")
    begun = broker.http.post("/v1/transactions", json={
        "producer_group": group, "topic": topic, "message": {"body": "x"}})
    assert begun.status_code == 200, begun.text
    txid = begun.json()["transaction_id"]
    one = broker.http.post(f"/v1/transactions/{txid}/end", json={"action": "commit"})
    assert "producer_group" in broker.error(one, 400, "BAD_REQUEST")
    many = broker.http.post("/v1/transactions/end", json={
        "ends": [{"transaction_id": txid, "action": "commit"}]})
    assert "producer_group" in broker.error(many, 400, "BAD_REQUEST")
    assert broker.pull(topic, 0)["messages"] == []  # neither end took effect
    wrong = broker.http.post(f"/v1/transactions/{txid}/end",
                             json={"producer_group": unique("other"), "action": "commit"})
    assert wrong.status_code == 400, wrong.text
    ok = broker.http.post(f"/v1/transactions/{txid}/end",
                          json={"producer_group": group, "action": "commit"})
    assert ok.status_code == 200 and ok.json() == {"state": "committed"}


def test_a_delay_past_64_bits_or_the_maximum_is_out_of_range(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=1)
    for raw in ("18446744073709551615", "1180591620717411303424"):  # 2**64 - 1, 2**70
        resp = broker.http.post(f"/v1/topics/{topic}/messages",
                                content=f'{{"messages": [{{"body": "x", "delay_ms": {raw}}}]}}',
                                headers={"content-type": "application/json"})
        message = broker.error(resp, 400, "INVALID_DELAY")
        assert "delay_ms" in message and "maximum delay" in message and "float" not in message
