"""``POST /v1/pull``: one long poll over many queues, against a real broker and redis-server."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgpack
import pytest

from tests.support.broker import BrokerHandle, msgpack_post, run_broker
from tests.support.procs import RedisServer
from tests.support.wait import wait_until
from tidemq_server.broker.messaging.pull import WAIT_SLICE_S
from tidemq_server.common.constants import LONG_POLL_MAX_MS

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory,
           redis_server: RedisServer) -> Iterator[BrokerHandle]:
    with run_broker(tmp_path_factory.mktemp("pull-many"), redis_server.url) as handle:
        yield handle


def poll(broker: BrokerHandle, queues: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    resp = broker.http.post("/v1/pull", json={"queues": queues, **extra})
    assert resp.status_code == 200, resp.text
    answer: dict[str, Any] = resp.json()
    return answer


def by_queue(answer: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(e["topic"], e["queue_id"]): e for e in answer["queues"]}


def test_reads_many_queues_of_many_topics_and_lists_only_those_with_news(
        broker: BrokerHandle) -> None:
    a, b = broker.create_topic(queues=3), broker.create_topic(queues=2)
    broker.send(a, {"body": "a0", "queue_id": 0}, {"body": "a0'", "queue_id": 0},
                {"body": "a2", "queue_id": 2})
    broker.send(b, {"body": "b1", "queue_id": 1})
    asks = [{"topic": a, "queue_id": q, "offset": 0} for q in range(3)]
    asks += [{"topic": b, "queue_id": q, "offset": 0} for q in range(2)]
    got = by_queue(poll(broker, asks, wait_ms=5000, group="g-many"))
    assert set(got) == {(a, 0), (a, 2), (b, 1)}  # quiet queues are left out
    assert [m["body"] for m in got[(a, 0)]["messages"]] == ["a0", "a0'"]
    assert got[(a, 0)]["next_offset"] == 2 and got[(a, 0)]["max_offset"] == 2
    assert got[(a, 0)]["min_offset"] == 0
    assert [m["body"] for m in got[(b, 1)]["messages"]] == ["b1"]
    # per-queue max, and each queue from its own offset
    got = by_queue(poll(broker, [{"topic": a, "queue_id": 0, "offset": 1},
                                 {"topic": a, "queue_id": 2, "offset": 0}], max=1))
    assert [m["body"] for m in got[(a, 0)]["messages"]] == ["a0'"]
    assert [m["body"] for m in got[(a, 2)]["messages"]] == ["a2"]


def test_a_held_poll_answers_the_moment_any_queue_gets_a_message(broker: BrokerHandle) -> None:
    """The send's dispatch wakes the held poll (the broker counts it woken, not timed out or
    re-read), and it answers with that one queue."""
    a, b = broker.create_topic(queues=2), broker.create_topic(queues=2)
    asks = [{"topic": t, "queue_id": q, "offset": 0} for t in (a, b) for q in range(2)]
    woken = broker.pulls_woken()
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(poll, broker, asks, wait_ms=LONG_POLL_MAX_MS)
        wait_until(lambda: broker.held_pulls() == 1,
                   what="the poll held: nothing in any queue")
        broker.send(b, {"body": "wake", "queue_id": 1})
        got = by_queue(held.result())
    assert list(got) == [(b, 1)]
    assert [m["body"] for m in got[(b, 1)]["messages"]] == ["wake"]
    assert broker.pulls_woken() == woken + 1


def test_a_poll_times_out_empty(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=2)
    started = time.monotonic()
    answer = poll(broker, [{"topic": topic, "queue_id": q, "offset": 0} for q in range(2)],
                  wait_ms=300)
    assert answer == {"queues": []}
    # held for its wait_ms, and ended by it: one that ignored it would sit out a 5 s slice
    assert 0.25 < time.monotonic() - started < WAIT_SLICE_S


def test_each_queue_reports_its_own_error_and_the_others_are_answered(
        broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=2)
    broker.send(topic, {"body": "ok", "queue_id": 0})
    answer = poll(broker, [{"topic": topic, "queue_id": 0, "offset": 0},
                           {"topic": topic, "queue_id": 1, "offset": 5},
                           {"topic": topic, "queue_id": 7, "offset": 0},
                           {"topic": "NoSuchTopic-x", "queue_id": 0, "offset": 0}],
                  wait_ms=2000)
    got = by_queue(answer)
    assert [m["body"] for m in got[(topic, 0)]["messages"]] == ["ok"]
    assert got[(topic, 1)]["error"]["code"] == "OFFSET_OUT_OF_RANGE"
    assert got[(topic, 7)]["error"]["code"] == "BAD_REQUEST"
    assert "queue_id 7" in got[(topic, 7)]["error"]["message"]
    assert got[("NoSuchTopic-x", 0)]["error"]["code"] == "TOPIC_NOT_FOUND"


def test_tags_per_queue_and_a_moved_offset_is_reported(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=1)
    broker.send(topic, {"body": "y", "tag": "Y", "queue_id": 0})
    woken = broker.pulls_woken()
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(poll, broker, [{"topic": topic, "queue_id": 0, "offset": 0,
                                           "tags": "Z"}], wait_ms=LONG_POLL_MAX_MS)
        wait_until(lambda: broker.held_pulls() == 1, what="the poll held")
        broker.send(topic, {"body": "not z", "tag": "Y", "queue_id": 0})
        wait_until(lambda: broker.pulls_woken() == woken + 1 and broker.held_pulls() == 1,
                   what="woken and held again")
        assert not held.done()  # another tag does not answer it
        broker.send(topic, {"body": "z!", "tag": "Z", "queue_id": 0})
        entry = by_queue(held.result())[(topic, 0)]
    assert [m["body"] for m in entry["messages"]] == ["z!"] and entry["next_offset"] == 3
    # only other tags past the offset: the timed-out answer says where to go on
    broker.send(topic, {"body": "y2", "tag": "Y", "queue_id": 0})
    entry = by_queue(poll(broker, [{"topic": topic, "queue_id": 0, "offset": 3, "tags": "Z"}],
                          wait_ms=200))[(topic, 0)]
    assert entry["messages"] == [] and entry["next_offset"] == 4


def test_msgpack_keeps_raw_bytes(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=1)
    raw = bytes(range(256))
    resp = msgpack_post(broker.http, f"/v1/topics/{topic}/messages", {"messages": [{"body": raw}]})
    assert resp.status_code == 200, resp.text
    resp = msgpack_post(broker.http, "/v1/pull",
                        {"queues": [{"topic": topic, "queue_id": 0, "offset": 0}]})
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/msgpack"
    answer = msgpack.unpackb(resp.content, raw=False)
    assert answer["queues"][0]["messages"][0]["body"] == raw


@pytest.mark.parametrize(("body", "names"), [
    ({}, "queues"),
    ({"queues": []}, "queues"),
    ({"queues": [{"topic": "t", "queue_id": -1}]}, "queues.0.queue_id"),
    ({"queues": [{"topic": "t", "queue_id": 0, "offset": "1"}]}, "queues.0.offset"),
    ({"queues": [{"topic": "t", "queue_id": 0, "colour": 1}]}, "queues.0.colour"),
    ({"queues": [{"queue_id": 0}]}, "queues.0"),
    ({"queues": [{"topic": "t", "queue_id": 0}], "max": 0}, "max"),
    ({"queues": [{"topic": "t", "queue_id": 0}], "wait_ms": 30_001}, "wait_ms"),
    ({"queues": [{"topic": "t", "queue_id": 0}], "extra": 1}, "extra"),
])
def test_bad_bodies_are_400_naming_the_field(broker: BrokerHandle, body: dict[str, Any],
                                             names: str) -> None:
    message = broker.error(broker.http.post("/v1/pull", json=body), 400, "BAD_REQUEST")
    assert names in message
