"""The broker's public API against a real broker process and a real redis-server."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgpack
import pytest

from tests.support.broker import BrokerHandle, msgpack_post, run_broker, unique
from tests.support.clock import now_ms
from tests.support.procs import RedisServer
from tests.support.wait import wait_until
from tidemq_server.broker.messaging.pull import WAIT_SLICE_S
from tidemq_server.common.constants import LONG_POLL_MAX_MS

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory,
           redis_server: RedisServer) -> Iterator[BrokerHandle]:
    with run_broker(tmp_path_factory.mktemp("api"), redis_server.url,
                    max_reconsume_times=2, consumer_expiry_s=1.0,
                    group_expiry_interval_s=0.2) as handle:
        yield handle


# --- send and pull -------------------------------------------------------------------------------

def test_send_pull_json_round_trip(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=2)
    before = now_ms()
    results = broker.send(
        topic,
        {"message_id": "id-1", "body": "héllo", "tag": "TagA", "keys": ["k1", "k2"],
         "properties": {"color": "red"}, "queue_id": 1},
        {"body": "second", "queue_id": 1},
    )
    assert [r["queue_id"] for r in results] == [1, 1]
    assert [r["queue_offset"] for r in results] == [0, 1]
    assert results[0]["message_id"] == "id-1"
    assert len(results[1]["message_id"]) >= 16  # assigned by the broker
    answer = broker.pull(topic, 1)
    assert answer["next_offset"] == 2 and answer["min_offset"] == 0
    assert answer["max_offset"] == 2
    first, second = answer["messages"]
    assert first["message_id"] == "id-1" and first["body"] == "héllo"
    assert first["body_encoding"] == "utf-8"
    assert first["tag"] == "TagA" and first["keys"] == ["k1", "k2"]
    assert first["properties"] == {"color": "red"}  # reserved properties stripped
    assert first["topic"] == topic and first["queue_id"] == 1 and first["queue_offset"] == 0
    assert first["born_timestamp_ms"] >= before and first["store_timestamp_ms"] >= before
    assert first["reconsume_times"] == 0
    assert second["message_id"] == results[1]["message_id"] and second["tag"] is None


def test_msgpack_round_trip_keeps_raw_bytes(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=1)
    raw = bytes(range(256))
    resp = msgpack_post(broker.http, f"/v1/topics/{topic}/messages",
                        {"messages": [{"body": raw, "message_id": "mp-1", "tag": "b"}]})
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("application/msgpack")
    assert msgpack.unpackb(resp.content)["results"][0]["message_id"] == "mp-1"
    resp = broker.http.get(f"/v1/topics/{topic}/queues/0/messages",
                           headers={"accept": "application/msgpack"})
    msg = msgpack.unpackb(resp.content, raw=False)["messages"][0]
    assert msg["body"] == raw and msg["tag"] == "b"
    # the same message over JSON: not UTF-8, so base64
    msg = broker.pull(topic, 0)["messages"][0]
    assert msg["body_encoding"] == "base64" and base64.b64decode(msg["body"]) == raw


def test_base64_body_in_json(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=1)
    broker.send(topic, {"body": base64.b64encode(b"plain text").decode(),
                        "body_encoding": "base64"},
                {"body": base64.b64encode(b"\xff\xfe").decode(), "body_encoding": "base64"})
    one, two = broker.pull(topic, 0)["messages"]
    assert (one["body"], one["body_encoding"]) == ("plain text", "utf-8")
    assert (two["body"], two["body_encoding"]) == (base64.b64encode(b"\xff\xfe").decode(),
                                                   "base64")


def test_queue_selection(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=4)
    sharded = broker.send(topic, *({"body": str(i), "sharding_key": "user-7"} for i in range(6)))
    assert len({r["queue_id"] for r in sharded}) == 1
    assert [r["queue_offset"] for r in sharded] == list(range(6))
    spread = broker.send(topic, *({"body": str(i)} for i in range(8)))
    assert {r["queue_id"] for r in spread} == {0, 1, 2, 3}


def test_pull_offsets_below_min_and_above_max(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=1)
    broker.send(topic, {"body": "a"}, {"body": "b"})
    answer = broker.pull(topic, 0, offset=1, max=1)
    assert [m["body"] for m in answer["messages"]] == ["b"] and answer["next_offset"] == 2
    resp = broker.http.get(f"/v1/topics/{topic}/queues/0/messages", params={"offset": 3})
    assert "max_offset 2" in broker.error(resp, 400, "OFFSET_OUT_OF_RANGE")
    empty = broker.pull(topic, 0, offset=2)
    assert empty["messages"] == [] and empty["next_offset"] == 2


def test_a_send_wakes_the_held_long_poll(broker: BrokerHandle) -> None:
    """The send's dispatch wakes the held pull (how fast is bench/produce_consume.py's "wake"
    segment): the broker counts the pull as woken, not as timed out or re-read."""
    topic = broker.create_topic(queues=1)
    woken = broker.pulls_woken()
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(broker.pull, topic, 0, offset=0, wait_ms=LONG_POLL_MAX_MS)
        wait_until(lambda: broker.held_pulls() == 1, what="the pull held")
        broker.send(topic, {"body": "wake"})
        answer = held.result()
    assert [m["body"] for m in answer["messages"]] == ["wake"]
    assert broker.pulls_woken() == woken + 1
    assert broker.held_pulls() == 0


def test_long_poll_times_out_empty(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=1)
    started = time.monotonic()
    answer = broker.pull(topic, 0, wait_ms=300)
    assert answer["messages"] == [] and answer["next_offset"] == 0
    # held for its wait_ms, and ended by it: a pull that ignored it would sit out a whole
    # re-read slice (5 s) at least
    assert 0.25 < time.monotonic() - started < WAIT_SLICE_S


def test_tag_filter_is_exact_and_skips(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=1)
    broker.send(topic, *({"body": f"{tag}{i}", "tag": tag}
                         for i in range(3) for tag in ("A", "B", "C", "AB")))
    answer = broker.pull(topic, 0, tags="A || C", max=100)
    assert [m["body"] for m in answer["messages"]] == ["A0", "C0", "A1", "C1", "A2", "C2"]
    assert answer["next_offset"] == 12
    only_b = broker.pull(topic, 0, tags="B", max=2)
    assert [m["tag"] for m in only_b["messages"]] == ["B", "B"]
    # a held pull with a filter: a message of another tag wakes it, it does not answer it
    woken = broker.pulls_woken()
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(broker.pull, topic, 0, offset=12, tags="Z",
                           wait_ms=LONG_POLL_MAX_MS)
        wait_until(lambda: broker.held_pulls() == 1, what="the pull held")
        broker.send(topic, {"body": "not z", "tag": "Y"})
        wait_until(lambda: broker.pulls_woken() == woken + 1
                   and broker.held_pulls() == 1, what="woken and held again")
        assert not held.done()
        broker.send(topic, {"body": "z!", "tag": "Z"})
        answer = held.result()
    assert [m["body"] for m in answer["messages"]] == ["z!"]


# --- topics --------------------------------------------------------------------------------------

def test_topic_admin(broker: BrokerHandle) -> None:
    name = unique("Admin")
    resp = broker.http.put(f"/v1/topics/{name}", json={"queues": 3})
    assert resp.json() == {"name": name, "queues": 3, "perm": "rw"}
    resp = broker.http.put(f"/v1/topics/{name}", json={"queues": 5, "perm": "r"})
    assert resp.json() == {"name": name, "queues": 5, "perm": "r"}
    names = [t["name"] for t in broker.http.get("/v1/topics").json()["topics"]]
    assert name in names
    desc = broker.http.get(f"/v1/topics/{name}").json()
    assert desc["queues"] == 5 and len(desc["offsets"]) == 5
    assert desc["offsets"][0] == {"queue_id": 0, "min": 0, "max": 0}
    # read-only: sends refused
    resp = broker.http.post(f"/v1/topics/{name}/messages", json={"messages": [{"body": "x"}]})
    assert "read-only" in broker.error(resp, 400, "BAD_REQUEST")


def test_topic_admin_errors(broker: BrokerHandle) -> None:
    broker.error(broker.http.put("/v1/topics/bad name!", json={}), 400, "INVALID_TOPIC_NAME")
    broker.error(broker.http.put("/v1/topics/%RETRY%g", json={}), 403, "FORBIDDEN_SYSTEM_TOPIC")
    broker.error(broker.http.put("/v1/topics/RMQ_SYS_X", json={}), 403, "FORBIDDEN_SYSTEM_TOPIC")
    name = unique("T")
    broker.error(broker.http.put(f"/v1/topics/{name}", json={"queues": 0}), 400, "BAD_REQUEST")
    broker.error(broker.http.put(f"/v1/topics/{name}", json={"queues": 1025}), 400,
                 "BAD_REQUEST")
    broker.error(broker.http.put(f"/v1/topics/{name}", json={"perm": "x"}), 400, "BAD_REQUEST")
    broker.error(broker.http.get(f"/v1/topics/{name}"), 404, "TOPIC_NOT_FOUND")


# --- query ---------------------------------------------------------------------------------------

def test_query_by_id_key_and_time(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=2)
    begin = now_ms() - 1
    broker.send(topic, {"message_id": unique("q"), "body": "x", "keys": ["order-1"]},
                {"message_id": "query-me-" + topic, "body": "y", "keys": ["order-2"]})
    end = now_ms() + 1
    msg = broker.http.get(f"/v1/messages/query-me-{topic}").json()
    assert msg["body"] == "y" and msg["state"] == "stored" and msg["topic"] == topic
    by_key = broker.http.get("/v1/messages", params={"topic": topic, "key": "order-2"}).json()
    assert [m["body"] for m in by_key["messages"]] == ["y"]
    by_time = broker.http.get("/v1/messages", params={"topic": topic, "begin_ms": begin,
                                                      "end_ms": end}).json()
    assert sorted(m["body"] for m in by_time["messages"]) == ["x", "y"]
    broker.error(broker.http.get("/v1/messages/never-sent"), 404, "MESSAGE_NOT_FOUND")
    broker.error(broker.http.get("/v1/messages", params={"topic": topic}), 400, "BAD_REQUEST")


# --- groups --------------------------------------------------------------------------------------

def test_offsets_commit_and_lag(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=2)
    broker.send(topic, *({"body": str(i), "queue_id": 0} for i in range(5)))
    group = unique("G")
    resp = broker.http.put(f"/v1/groups/{group}/offsets",
                           json={"offsets": [{"topic": topic, "queue_id": 0, "offset": 2},
                                             {"topic": topic, "queue_id": 1, "offset": 0}]})
    assert resp.status_code == 200 and resp.json() == {}
    got = broker.http.get(f"/v1/groups/{group}/offsets", params={"topic": topic}).json()
    assert got["offsets"] == [
        {"topic": topic, "queue_id": 0, "offset": 2, "max_offset": 5, "lag": 3},
        {"topic": topic, "queue_id": 1, "offset": 0, "max_offset": 0, "lag": 0},
    ]
    assert broker.http.get(f"/v1/groups/{group}/offsets").json() == got  # every topic
    unknown = broker.http.get(f"/v1/groups/{unique('none')}/offsets", params={"topic": topic})
    assert unknown.json() == {"offsets": []}
    resp = broker.http.put(f"/v1/groups/{group}/offsets",
                           json={"offsets": [{"topic": topic, "queue_id": 0, "offset": 6}]})
    broker.error(resp, 400, "OFFSET_OUT_OF_RANGE")
    resp = broker.http.put(f"/v1/groups/{group}/offsets", json={"offsets": [{"topic": topic}]})
    broker.error(resp, 400, "BAD_REQUEST")


def test_group_heartbeat_leave_and_expiry(broker: BrokerHandle) -> None:
    group = unique("G")
    path = f"/v1/groups/{group}/heartbeat"
    body = {"subscriptions": {"T": "*"}, "mode": "clustering"}
    b_sent = time.monotonic()  # b's one heartbeat
    assert broker.http.post(path, json={"client_id": "b", **body}).json() == {"members": ["b"]}
    assert broker.http.post(path, json={"client_id": "a", **body}).json() == {
        "members": ["a", "b"]}
    assert broker.http.delete(f"/v1/groups/{group}/members/a").json() == {}
    assert broker.http.post(path, json={"client_id": "c", **body}).json() == {
        "members": ["b", "c"]}

    def c_beats() -> list[str]:
        members: list[str] = broker.http.post(path, json={"client_id": "c", **body}).json()[
            "members"]
        return members

    # c keeps beating: b stays a member until it has been silent for consumer_expiry_s (1 s),
    # then it is dropped and c, heard all along, stays
    after = wait_until(lambda: (m := c_beats()) != ["b", "c"] and m, what="b to expire")
    assert after == ["c"] and time.monotonic() - b_sent >= 1.0
    broker.error(broker.http.post(path, json={"client_id": "c", "mode": "x"}), 400,
                 "BAD_REQUEST")
    broker.error(broker.http.post(path, json={}), 400, "BAD_REQUEST")


def test_retry_then_dead_letter(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=1)
    group = unique("G")
    mid = unique("m")
    broker.send(topic, {"message_id": mid, "body": "fail me", "tag": "T1", "keys": ["k"],
                        "properties": {"p": "1"}})
    path = f"/v1/groups/{group}/retry"
    destinations = [broker.http.post(path, json={"message_id": mid}).json()["destination"]
                    for _ in range(3)]
    assert destinations == [f"%RETRY%{group}", f"%RETRY%{group}", f"%DLQ%{group}"]
    retried = broker.pull(f"%RETRY%{group}", 0)["messages"]
    assert [m["reconsume_times"] for m in retried] == [1, 2]
    assert all(m["message_id"] == mid and m["tag"] == "T1" and m["keys"] == ["k"]
               and m["properties"] == {"p": "1"} and m["origin_topic"] == topic
               for m in retried)
    dead = broker.pull(f"%DLQ%{group}", 0)["messages"]
    assert [(m["message_id"], m["reconsume_times"]) for m in dead] == [(mid, 3)]
    shown = broker.http.get(f"/v1/messages/{mid}").json()  # the original, with its history
    assert shown["topic"] == topic and shown["retries"][0]["dead_lettered"] is True
    broker.error(broker.http.post(path, json={"message_id": "nope"}), 404, "MESSAGE_NOT_FOUND")
    resp = broker.http.post(path, json={"message_id": mid, "delay_level": 19})  # 1-18 only
    broker.error(resp, 400, "INVALID_DELAY")


def test_retry_reason_is_kept_on_the_copy(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=1)
    group = unique("G")
    mid = unique("m")
    broker.send(topic, {"message_id": mid, "body": "{}", "properties": {"p": "1"}})
    path = f"/v1/groups/{group}/retry"
    reasons = ["BodyDecodeError: order_id: Field required", None,
               "ValueError: no such customer"]
    for reason in reasons:
        body = {"message_id": mid} | ({"reason": reason} if reason else {})
        assert broker.http.post(path, json=body).status_code == 200
    retried = broker.pull(f"%RETRY%{group}", 0)["messages"]
    assert [m["properties"] for m in retried] == [
        {"p": "1", "TIDE_CONSUME_FAILURE": reasons[0]}, {"p": "1"}]  # a stale reason is dropped
    [dead] = broker.pull(f"%DLQ%{group}", 0)["messages"]
    assert dead["properties"] == {"p": "1", "TIDE_CONSUME_FAILURE": reasons[2]}
    too_long = broker.http.post(path, json={"message_id": mid, "reason": "x" * 1025})
    broker.error(too_long, 400, "BAD_REQUEST")


def test_simple_consumer_receive_ack_invisibility(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=2)
    broker.send(topic, *({"body": str(i)} for i in range(4)))
    group = unique("S")
    got: list[dict[str, Any]] = []
    for _ in range(10):  # a receive may serve fewer than available
        got += broker.http.post(f"/v1/groups/{group}/receive",
                                json={"topic": topic, "max": 10, "invisible_ms": 60_000,
                                      "wait_ms": 1000}).json()["messages"]
        if len(got) == 4:
            break
    assert sorted(m["body"] for m in got) == ["0", "1", "2", "3"]
    assert all(m["receipt_handle"] for m in got)
    handle = got[0]["receipt_handle"]
    new = broker.http.post(f"/v1/groups/{group}/invisibility",
                           json={"receipt_handle": handle, "invisible_ms": 60_000}).json()
    assert new["receipt_handle"] != handle
    handles = [m["receipt_handle"] for m in got[1:]] + [new["receipt_handle"]]
    acked = broker.http.post(f"/v1/groups/{group}/ack", json={"receipt_handles": handles})
    assert acked.json() == {"acked": 4}
    resp = broker.http.post(f"/v1/groups/{group}/ack", json={"receipt_handles": ["garbage"]})
    broker.error(resp, 400, "INVALID_RECEIPT_HANDLE")
    resp = broker.http.post(f"/v1/groups/{group}/invisibility",
                            json={"receipt_handle": handle, "invisible_ms": 1000})
    broker.error(resp, 400, "INVALID_RECEIPT_HANDLE")  # superseded by the new handle
