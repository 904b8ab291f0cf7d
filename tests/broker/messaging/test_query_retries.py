"""GET /v1/messages/{id} after consumer retries: the original message with its retry history;
key queries carry each message's state. Real broker and redis-server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.broker import BrokerHandle, run_broker, unique
from tests.support.clock import now_ms
from tests.support.procs import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory,
           redis_server: RedisServer) -> Iterator[BrokerHandle]:
    # no scheduler: a retry goes straight to %RETRY%group unless it asks for a delay level
    with run_broker(tmp_path_factory.mktemp("query-retries"), redis_server.url,
                    max_reconsume_times=2) as handle:
        yield handle


def retry(broker: BrokerHandle, group: str, message_id: str, **extra: int) -> str:
    resp = broker.http.post(f"/v1/groups/{group}/retry",
                            json={"message_id": message_id, **extra})
    assert resp.status_code == 200, resp.text
    return str(resp.json()["destination"])


def test_lookup_after_retries_shows_the_original_and_where_copies_went(
        broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=2)
    sent = broker.send(topic, {"body": "pay order 7", "tag": "Pay", "keys": ["order-7"],
                               "queue_id": 1})[0]
    mid = sent["message_id"]
    plain = broker.http.get(f"/v1/messages/{mid}").json()
    assert "retries" not in plain  # optional: only once a group sent the message back

    group, other = unique("G"), unique("G")
    assert retry(broker, group, mid) == f"%RETRY%{group}"
    assert retry(broker, group, mid) == f"%RETRY%{group}"
    assert retry(broker, group, mid) == f"%DLQ%{group}"  # third failure > max 2
    assert retry(broker, other, mid) == f"%RETRY%{other}"

    found = broker.http.get(f"/v1/messages/{mid}").json()
    assert (found["topic"], found["queue_id"], found["queue_offset"]) == (topic, 1,
                                                                          sent["queue_offset"])
    assert found["state"] == "stored" and found["reconsume_times"] == 0
    assert found["body"] == "pay order 7" and "origin_topic" not in found

    by_group = {r["group"]: r for r in found["retries"]}
    assert list(by_group) == sorted([group, other])
    mine = by_group[group]
    assert mine["reconsume_times"] == 3 and mine["dead_lettered"] is True
    assert [(c["topic"], c["reconsume_times"], c["state"]) for c in mine["copies"]] == [
        (f"%RETRY%{group}", 1, "stored"), (f"%RETRY%{group}", 2, "stored"),
        (f"%DLQ%{group}", 3, "stored")]
    assert [c["queue_offset"] for c in mine["copies"][:2]] == [0, 1]
    assert by_group[other]["dead_lettered"] is False
    assert by_group[other]["reconsume_times"] == 1


def test_a_retry_waiting_out_its_delay_is_scheduled_in_the_history(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=1)
    mid = broker.send(topic, {"body": "later"})[0]["message_id"]
    group = unique("G")
    before = now_ms()
    retry(broker, group, mid, delay_level=3)  # 10 s; no scheduler here delivers it

    found = broker.http.get(f"/v1/messages/{mid}").json()
    assert found["topic"] == topic and found["state"] == "stored"
    [entry] = found["retries"]
    [copy] = entry["copies"]
    assert copy["topic"] == f"%RETRY%{group}" and copy["state"] == "scheduled"
    assert copy["deliver_at_ms"] >= before + 9_000
    assert "queue_offset" not in copy


def test_key_query_answers_each_message_state(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=1)
    key = unique("k")
    broker.send(topic, {"body": "one", "keys": [key]}, {"body": "two", "keys": [key]})
    found = broker.http.get("/v1/messages", params={"topic": topic, "key": key}).json()
    assert [(m["body"], m["state"]) for m in found["messages"]] == [("one", "stored"),
                                                                   ("two", "stored")]
    now = now_ms()
    by_time = broker.http.get("/v1/messages", params={"topic": topic, "begin_ms": now - 60_000,
                                                      "end_ms": now + 1000}).json()
    assert {m["state"] for m in by_time["messages"]} == {"stored"}
