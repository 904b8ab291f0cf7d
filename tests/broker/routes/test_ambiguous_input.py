"""Input with two readings is refused, naming the field, never silently resolved (real broker).

Heartbeats: a bad topic name is 400 INVALID_TOPIC_NAME, a bad tag expression 400 naming it,
and a subscription to a topic this broker does not have is not listed by ``GET /v1/groups``.
Sends: ``queue_id`` with ``sharding_key``; one id twice in a batch with other content; a tag no
subscription could select. Queries: a parameter the endpoint does not take (``?offest=0``).
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support.broker import BrokerHandle, msgpack_post, run_broker, unique
from tests.support.procs import RedisServer, ServiceProcess, free_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory,
           redis_server: RedisServer) -> Iterator[BrokerHandle]:
    with run_broker(tmp_path_factory.mktemp("ambiguous"), redis_server.url) as b:
        yield b


def _groups(b: BrokerHandle) -> dict[str, dict[str, object]]:
    return {g["group"]: g for g in b.http.get("/v1/groups").json()["groups"]}


@pytest.mark.parametrize("topic", ["../x", "a b", "", "x" * 128, "T/1"])
def test_a_heartbeat_to_a_bad_topic_name_is_refused(broker: BrokerHandle, topic: str) -> None:
    group = unique("g")
    resp = broker.http.post(f"/v1/groups/{group}/heartbeat", json={
        "client_id": "c1", "subscriptions": {topic: "*"}})
    broker.error(resp, 400, "INVALID_TOPIC_NAME")
    assert group not in _groups(broker)


@pytest.mark.parametrize("expression", ["A ||| || ", "A ||", "|| A", "A | B", "A || B|",
                                        "\x01"])
def test_a_heartbeat_with_a_bad_tag_expression_is_refused(broker: BrokerHandle,
                                                          expression: str) -> None:
    topic, group = broker.create_topic(), unique("g")
    resp = broker.http.post(f"/v1/groups/{group}/heartbeat", json={
        "client_id": "c1", "subscriptions": {topic: expression}})
    message = broker.error(resp, 400, "BAD_REQUEST")
    assert repr(expression) in message and topic in message
    assert group not in _groups(broker)
    pulled = broker.http.get(f"/v1/topics/{topic}/queues/0/messages",
                             params={"offset": 0, "tags": expression})
    assert repr(expression) in broker.error(pulled, 400, "BAD_REQUEST")


def test_good_expressions_are_kept_and_unknown_topics_not_listed(broker: BrokerHandle) -> None:
    topic, group = broker.create_topic(), unique("g")
    missing = unique("NoSuchTopic")
    resp = broker.http.post(f"/v1/groups/{group}/heartbeat", json={
        "client_id": "c1", "subscriptions": {topic: " B ||A ", missing: "*"}})
    assert resp.status_code == 200, resp.text
    listed = _groups(broker)[group]
    assert listed["subscriptions"] == {topic: "A || B"}
    assert listed["topics"] == [topic]


def test_queue_id_with_sharding_key_is_refused(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=4)
    resp = broker.http.post(f"/v1/topics/{topic}/messages", json={"messages": [
        {"body": "x", "queue_id": 3, "sharding_key": "user-7"}]})
    assert "sharding_key" in broker.error(resp, 400, "BAD_REQUEST")
    assert all(q["max"] == 0 for q in broker.http.get(f"/v1/topics/{topic}").json()["offsets"])


def test_one_id_twice_in_a_batch_with_other_content_is_refused(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=1)
    mid = unique("m")
    resp = broker.http.post(f"/v1/topics/{topic}/messages", json={"messages": [
        {"message_id": mid, "body": "first"}, {"message_id": mid, "body": "second"}]})
    message = broker.error(resp, 400, "BAD_REQUEST")
    assert "messages[1].message_id" in message and "messages[0]" in message
    assert broker.http.get(f"/v1/messages/{mid}").status_code == 404  # nothing stored
    same = {"message_id": mid, "body": "same"}  # a repeat of the same message stays harmless
    resp = msgpack_post(broker.http, f"/v1/topics/{topic}/messages", {"messages": [same, same]})
    assert resp.status_code == 200, resp.text
    assert broker.pull(topic, 0)["max_offset"] == 1


@pytest.mark.parametrize("tag", ["A || B", "*", "A|B", " A", "A "])
def test_a_tag_no_subscription_could_select_is_refused(broker: BrokerHandle, tag: str) -> None:
    topic = broker.create_topic(queues=1)
    resp = broker.http.post(f"/v1/topics/{topic}/messages", json={"messages": [
        {"body": "x", "tag": tag}]})
    assert "messages[0].tag" in broker.error(resp, 400, "BAD_REQUEST")
    resp = broker.http.post("/v1/transactions", json={
        "producer_group": unique("pg"), "topic": topic, "message": {"body": "x", "tag": tag}})
    assert "tag" in broker.error(resp, 400, "BAD_REQUEST")
    assert broker.pull(topic, 0)["max_offset"] == 0


@pytest.mark.parametrize(("path", "params", "wrong"), [
    ("/v1/topics/{t}/queues/0/messages", {"offest": "0"}, "offest"),
    ("/v1/topics/{t}/queues/0/messages", {"offset": "0", "wait": "10"}, "wait"),
    ("/v1/messages", {"topic": "{t}", "key": "k", "begin": "0"}, "begin"),
    ("/v1/groups/g/offsets", {"topik": "{t}"}, "topik"),
    ("/v1/topics/{t}", {"verbose": "1"}, "verbose"),
    ("/healthz", {"x": "1"}, "x"),
])
def test_a_misspelt_query_parameter_is_refused(broker: BrokerHandle, path: str,
                                               params: dict[str, str], wrong: str) -> None:
    topic = broker.create_topic()
    resp = broker.http.get(path.format(t=topic),
                           params={k: v.format(t=topic) for k, v in params.items()})
    message = broker.error(resp, 400, "BAD_REQUEST")
    assert message.startswith(f"{wrong}: unknown query parameter"), message


def test_the_nameserver_refuses_a_misspelt_query_parameter(broker: BrokerHandle) -> None:
    port = free_port()
    ns = ServiceProcess("nameserver", port, {"TIDEMQ_NAMESRV_PORT": str(port)},
                        broker.data_dir.parent).start()
    try:
        resp = httpx.get(f"{ns.url}/v1/cluster", params={"clster": "x"})
        assert resp.status_code == 400 and resp.json()["message"].startswith("clster:")
    finally:
        ns.stop()
