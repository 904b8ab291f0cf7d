"""A field the API does not know is refused (400 naming it), never silently ignored; a body that
is neither JSON nor msgpack, has no content type or names a charset other than UTF-8 is 415."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

from tests.support.broker import TOKEN, BrokerHandle, msgpack_post, run_broker, unique
from tests.support.procs import RedisServer

pytestmark = pytest.mark.integration

AUTH = {"X-Tidemq-Token": TOKEN}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory,
           redis_server: RedisServer) -> Iterator[BrokerHandle]:
    with run_broker(tmp_path_factory.mktemp("unknown-fields"), redis_server.url) as handle:
        yield handle


@pytest.fixture
def topic(broker: BrokerHandle) -> str:
    return broker.create_topic(queues=1)


def test_a_misspelt_delay_is_refused_and_nothing_is_stored(broker: BrokerHandle,
                                                          topic: str) -> None:
    body = {"messages": [{"body": "x"}, {"body": "x", "delayMs": 1_800_000}]}
    message = broker.error(broker.http.post(f"/v1/topics/{topic}/messages", json=body),
                           400, "BAD_REQUEST")
    assert "delayMs" in message and "messages[1]" in message
    packed = msgpack_post(broker.http, f"/v1/topics/{topic}/messages", body)
    assert "delayMs" in broker.error(packed, 400, "BAD_REQUEST")
    assert broker.pull(topic, 0)["messages"] == []


def test_an_unknown_field_beside_messages_is_refused(broker: BrokerHandle, topic: str) -> None:
    body = {"messages": [{"body": "x"}], "delay_ms": 5}
    resp = broker.http.post(f"/v1/topics/{topic}/messages", json=body)
    assert "delay_ms" in broker.error(resp, 400, "BAD_REQUEST")


def test_every_known_message_field_is_still_accepted(broker: BrokerHandle, topic: str) -> None:
    message = {"message_id": unique("m"), "body": "eA==", "body_encoding": "base64",
               "tag": "t", "keys": ["k"], "properties": {"p": "v"}, "queue_id": 0,
               "sharding_key": None, "delay_level": 0, "delay_ms": None,
               "deliver_at_ms": None}
    (result,) = broker.send(topic, message)
    assert result["message_id"] == message["message_id"]
    assert broker.pull(topic, 0)["messages"][0]["body"] == "x"


def _group_requests(topic: str) -> list[tuple[str, str, dict[str, Any], str]]:
    group = unique("g")
    return [
        ("PUT", f"/v1/topics/{unique('T')}", {"queues": 1, "permission": "rw"}, "permission"),
        ("POST", f"/v1/groups/{group}/heartbeat",
         {"client_id": "c", "subscription": {topic: "*"}}, "subscription"),
        ("PUT", f"/v1/groups/{group}/offsets",
         {"offsets": [{"topic": topic, "queue_id": 0, "offset": 0, "lag": 1}]}, "lag"),
        ("POST", f"/v1/groups/{group}/receive", {"topic": topic, "maxMessages": 3},
         "maxMessages"),
        ("POST", f"/v1/groups/{group}/ack", {"receipt_handles": [], "all": True}, "all"),
        ("POST", f"/v1/groups/{group}/retry", {"message_id": "m", "delay": 3}, "delay"),
        ("POST", f"/v1/producers/{group}/heartbeat", {"client_id": "c", "ttl": 5}, "ttl"),
        ("POST", "/v1/transactions",
         {"producer_group": group, "topic": topic, "message": {"body": "x"}, "timeout": 1},
         "timeout"),
        ("POST", "/v1/transactions",
         {"producer_group": group, "topic": topic, "message": {"body": "x", "tags": "t"}},
         "tags"),
        ("POST", "/v1/transactions/end",
         {"producer_group": group, "ends": [{"transaction_id": "t", "action": "commit",
                                             "fromCheck": True}]}, "fromCheck"),
        ("POST", "/v1/transactions/tx-1/end",
         {"producer_group": group, "action": "commit", "reason": "ok"}, "reason"),
        ("POST", f"/internal/v1/topics/{topic}/messages",
         {"records": [{"body": "x", "tags": "t"}]}, "tags"),
        ("POST", f"/internal/v1/topics/{topic}/messages",
         {"records": [{"body": "x"}], "dedupe": True}, "dedupe"),
        ("POST", "/internal/v1/retention-floor",
         {"owner": "o", "physical_offset": 0, "topic": topic}, "topic"),
        ("POST", "/internal/v1/transactions/actions",
         {"actions": [{"transaction_id": "t", "physical_offset": 0, "action": "check",
                       "why": "x"}]}, "why"),
        ("POST", "/internal/v1/schedule/progress",
         {"owner": "o", "positions": [], "floor": 0}, "floor"),
        ("POST", "/internal/v1/schedule/deliver", {"records": [], "stric": []}, "stric"),
    ]


def test_unknown_fields_of_other_requests_are_refused_in_both_encodings(
        broker: BrokerHandle, topic: str) -> None:
    for method, path, body, name in _group_requests(topic):
        for packed in (False, True):
            headers = dict(AUTH)
            if packed:
                headers["content-type"] = "application/msgpack"
                resp = broker.http.request(method, path, headers=headers,
                                           content=msgpack.packb(body, use_bin_type=True))
            else:
                resp = broker.http.request(method, path, headers=headers, json=body)
            assert resp.status_code == 400, (method, path, packed, resp.text)
            answer = resp.json()
            assert answer["code"] == "BAD_REQUEST" and name in answer["message"], \
                (method, path, answer)


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          "application/xml", "multipart/form-data; b=x"])
def test_a_body_neither_json_nor_msgpack_is_415(broker: BrokerHandle, topic: str,
                                                content_type: str) -> None:
    for method, path in (("POST", f"/v1/topics/{topic}/messages"),
                         ("PUT", f"/v1/topics/{topic}"),
                         ("POST", f"/v1/groups/{unique('g')}/heartbeat"),
                         ("POST", "/internal/v1/retention-floor")):
        resp = broker.http.request(method, path, content=b'{"messages": []}',
                                   headers={**AUTH, "content-type": content_type})
        message = broker.error(resp, 415, "UNSUPPORTED_MEDIA_TYPE")
        assert "application/json" in message and "application/msgpack" in message


def test_json_with_a_utf8_charset_is_json(broker: BrokerHandle, topic: str) -> None:
    body = b'{"messages": [{"body": "x"}]}'
    for content_type in ("application/json; charset=utf-8", 'application/json;charset="UTF-8"',
                         "application/msgpack; charset=utf-8"):
        packed = msgpack.packb({"messages": [{"body": "x"}]}) if "msgpack" in content_type \
            else body
        typed = broker.http.post(f"/v1/topics/{topic}/messages", content=packed,
                                 headers={"content-type": content_type})
        assert typed.status_code == 200, (content_type, typed.text)
    assert len(broker.pull(topic, 0)["messages"]) == 3


def _body_doors(topic: str) -> list[tuple[str, str]]:
    """A lean route (send), FastAPI routes reading a model, a transaction, an internal one."""
    return [("POST", f"/v1/topics/{topic}/messages"), ("PUT", f"/v1/topics/{topic}"),
            ("POST", f"/v1/groups/{unique('g')}/heartbeat"),
            ("POST", "/v1/transactions"),
            ("POST", "/internal/v1/retention-floor")]


def test_a_body_without_content_type_is_415_naming_the_accepted_types(
        broker: BrokerHandle, topic: str) -> None:
    body = b'{"messages": [{"body": "x"}]}'
    for method, path in _body_doors(topic):
        resp = broker.http.request(method, path, content=body, headers=AUTH)
        assert "content-type" not in resp.request.headers
        message = broker.error(resp, 415, "UNSUPPORTED_MEDIA_TYPE")
        assert "content-type" in message and "application/json" in message \
            and "application/msgpack" in message, (path, message)
    assert broker.pull(topic, 0)["messages"] == []


@pytest.mark.parametrize("charset", ["latin-1", "iso-8859-1", "utf-16", '"windows-1252"'])
def test_a_body_in_another_charset_is_415_not_read_as_utf8(broker: BrokerHandle, topic: str,
                                                           charset: str) -> None:
    body = '{"messages": [{"body": "café"}]}'.encode("latin-1")
    for method, path in _body_doors(topic):
        resp = broker.http.request(method, path, content=body, headers={
            **AUTH, "content-type": f"application/json; charset={charset}"})
        message = broker.error(resp, 415, "UNSUPPORTED_MEDIA_TYPE")
        assert charset.strip('"') in message and "utf-8" in message, (path, message)
    assert broker.pull(topic, 0)["messages"] == []
