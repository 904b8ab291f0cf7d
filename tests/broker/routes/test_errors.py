"""Every error code the broker's core API owns, triggered by a bad request: {code, message}."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.broker import TOKEN, BrokerHandle, run_broker, unique
from tests.support.clock import now_ms
from tests.support.procs import RedisServer

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory,
           redis_server: RedisServer) -> Iterator[BrokerHandle]:
    with run_broker(tmp_path_factory.mktemp("errors"), redis_server.url) as handle:
        yield handle


@pytest.fixture(scope="module")
def topic(broker: BrokerHandle) -> str:
    return broker.create_topic(queues=2)


def send(broker: BrokerHandle, topic: str, *messages: dict[str, Any]) -> httpx.Response:
    return broker.http.post(f"/v1/topics/{topic}/messages", json={"messages": list(messages)})


def test_bad_request(broker: BrokerHandle, topic: str) -> None:
    post = broker.http.post
    broker.error(post(f"/v1/topics/{topic}/messages", content=b"{nope",
                      headers={"content-type": "application/json"}), 400, "BAD_REQUEST")
    broker.error(post(f"/v1/topics/{topic}/messages", json={"msgs": []}), 400, "BAD_REQUEST")
    broker.error(post(f"/v1/topics/{topic}/messages", json={"messages": []}), 400, "BAD_REQUEST")
    broker.error(send(broker, topic, {"body": 5}), 400, "BAD_REQUEST")
    broker.error(send(broker, topic, {"body": "x", "queue_id": 2}), 400,
                 "BAD_REQUEST")
    message = broker.error(send(broker, topic, {"body": "x", "properties": {"UNIQ_KEY": "y"}}),
                           400, "BAD_REQUEST")
    assert "reserved" in message
    broker.error(broker.http.get(f"/v1/topics/{topic}/queues/0/messages",
                                 params={"max": 1025}), 400, "BAD_REQUEST")
    broker.error(broker.http.get(f"/v1/topics/{topic}/queues/0/messages",
                                 params={"offset": -1}), 400, "BAD_REQUEST")
    broker.error(broker.http.get(f"/v1/topics/{topic}/queues/9/messages"), 400, "BAD_REQUEST")


def test_invalid_topic_name(broker: BrokerHandle) -> None:
    broker.error(broker.http.put(f"/v1/topics/{'x' * 128}", json={}), 400, "INVALID_TOPIC_NAME")
    broker.error(send(broker, "bad.name", {"body": "x"}), 400,
                 "INVALID_TOPIC_NAME")


def test_invalid_delay(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=2)
    now = now_ms()
    for bad in ({"delay_level": 19}, {"delay_level": -1}, {"delay_ms": -5},
                {"delay_level": 2, "delay_ms": 100},
                {"deliver_at_ms": now + 31 * 24 * 3600 * 1000}):
        broker.error(send(broker, topic, {"body": "x", **bad}), 400,
                     "INVALID_DELAY")
    # a real delay is accepted: it waits for the scheduler (tests/scheduler), not in the topic
    for delayed in ({"delay_level": 3}, {"delay_ms": 5000}, {"deliver_at_ms": now + 60_000}):
        (result,) = broker.send(topic, {"body": "x", "queue_id": 0, **delayed})
        assert result["queue_id"] == 0
    # nothing of a rejected batch is stored
    resp = send(broker, topic, {"body": "fine", "queue_id": 0},
                {"body": "x", "delay_level": 19})
    broker.error(resp, 400, "INVALID_DELAY")
    assert broker.pull(topic, 0)["max_offset"] == 0
    # no delay, or a due time already past: delivered at once
    results = broker.send(topic, {"body": "now", "delay_ms": 0, "queue_id": 1},
                          {"body": "past", "deliver_at_ms": now - 1000, "queue_id": 1})
    assert [r["queue_offset"] for r in results] == [0, 1]


def test_invalid_body_encoding(broker: BrokerHandle, topic: str) -> None:
    broker.error(send(broker, topic, {"body": "!!!", "body_encoding": "base64"}),
                 400, "INVALID_BODY_ENCODING")
    broker.error(send(broker, topic, {"body": "x", "body_encoding": "rot13"}),
                 400, "INVALID_BODY_ENCODING")


def test_offset_out_of_range(broker: BrokerHandle, topic: str) -> None:
    resp = broker.http.get(f"/v1/topics/{topic}/queues/1/messages", params={"offset": 10**6})
    broker.error(resp, 400, "OFFSET_OUT_OF_RANGE")


def test_invalid_receipt_handle(broker: BrokerHandle) -> None:
    group = unique("G")
    forged = base64.urlsafe_b64encode(b"\x01" + b"\x00" * 40).rstrip(b"=").decode()
    for handle in ("", "not a handle", forged):
        resp = broker.http.post(f"/v1/groups/{group}/ack", json={"receipt_handles": [handle]})
        broker.error(resp, 400, "INVALID_RECEIPT_HANDLE")


def test_unauthorized_internal(broker: BrokerHandle) -> None:
    paths = [("POST", "/internal/v1/topics/RMQ_SYS_TRANS_HALF_TOPIC/messages"),
             ("GET", "/internal/v1/topics/RMQ_SYS_TRANS_HALF_TOPIC/queues/0/messages"),
             ("POST", "/internal/v1/retention-floor"), ("GET", "/internal/v1/records/0")]
    for method, path in paths:
        broker.error(broker.http.request(method, path, json={}), 401, "UNAUTHORIZED")
        broker.error(broker.http.request(method, path, json={},
                                         headers={"X-Tidemq-Token": TOKEN + "x"}),
                     401, "UNAUTHORIZED")


def test_forbidden_system_topic(broker: BrokerHandle) -> None:
    for name in ("RMQ_SYS_TRANS_HALF_TOPIC", "rmq_sys_x", "SCHEDULE_TOPIC_XXXX",
                 "TRANS_CHECK_MAX_TIME_TOPIC", "TIDE_SYS_TRANS_EVENTS", "%RETRY%g", "%DLQ%g"):
        broker.error(send(broker, name, {"body": "x"}), 403,
                     "FORBIDDEN_SYSTEM_TOPIC")
        broker.error(broker.http.put(f"/v1/topics/{name}", json={}), 403,
                     "FORBIDDEN_SYSTEM_TOPIC")


def test_topic_not_found(broker: BrokerHandle) -> None:
    missing = unique("missing")
    broker.error(send(broker, missing, {"body": "x"}), 404,
                 "TOPIC_NOT_FOUND")
    broker.error(broker.http.get(f"/v1/topics/{missing}/queues/0/messages"), 404,
                 "TOPIC_NOT_FOUND")
    broker.error(broker.http.get(f"/v1/topics/{missing}"), 404, "TOPIC_NOT_FOUND")
    broker.error(broker.http.get("/v1/messages", params={"topic": missing, "key": "k"}), 404,
                 "TOPIC_NOT_FOUND")


def test_message_not_found(broker: BrokerHandle) -> None:
    broker.error(broker.http.get(f"/v1/messages/{unique('m')}"), 404, "MESSAGE_NOT_FOUND")
    broker.error(broker.http.post(f"/v1/groups/{unique('G')}/retry",
                                  json={"message_id": unique("m")}), 404, "MESSAGE_NOT_FOUND")


def test_message_too_large(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=1)
    broker.error(send(broker, topic, {"body": "x" * (4 * MiB + 1)}), 413,
                 "MESSAGE_TOO_LARGE")
    big_props = {f"p{i}": "v" * 1000 for i in range(40)}
    broker.error(send(broker, topic, {"body": "x", "properties": big_props}),
                 413, "MESSAGE_TOO_LARGE")
    broker.error(send(broker, topic, *({"body": "x"} for _ in range(1025))),
                 413, "MESSAGE_TOO_LARGE")
    four = ({"body": "x" * (4 * MiB - 100)} for _ in range(5))
    broker.error(send(broker, topic, *four), 413, "MESSAGE_TOO_LARGE")
    assert broker.pull(topic, 0)["max_offset"] == 0  # nothing of it stored
