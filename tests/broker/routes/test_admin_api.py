"""Broker admin endpoints on real processes: GET /v1/groups, DELETE /v1/topics/{topic} (with the
nameserver's routes), and GET /v1/topics/{topic}?at_ms=."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.broker import TOKEN, BrokerHandle, run_broker, unique
from tests.support.clock import now_ms
from tests.support.procs import RedisServer, ServiceProcess, free_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def nameserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    port = free_port()
    env = {"TIDEMQ_NAMESRV_PORT": str(port), "TIDEMQ_NAMESRV_TOKEN": TOKEN}
    proc = ServiceProcess("nameserver", port, env, tmp_path_factory.mktemp("ns-admin")).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer,
           nameserver: ServiceProcess) -> Iterator[BrokerHandle]:
    with run_broker(tmp_path_factory.mktemp("admin"), redis_server.url,
                    nameservers=nameserver.url, consumer_expiry_s=1.0,
                    group_expiry_interval_s=0.2) as handle:
        yield handle


def groups_by_name(broker: BrokerHandle) -> dict[str, dict[str, object]]:
    resp = broker.http.get("/v1/groups")
    assert resp.status_code == 200, resp.text
    return {g["group"]: g for g in resp.json()["groups"]}


# --- GET /v1/groups ------------------------------------------------------------------------------

def test_groups_lists_live_members_and_committed_offsets(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=2)
    other = broker.create_topic(queues=1)
    live, committed_only = unique("G-live"), unique("G-offsets")
    broker.send(topic, {"body": "a", "queue_id": 0}, {"body": "b", "queue_id": 1})
    broker.send(other, {"body": "c"})

    resp = broker.http.post(f"/v1/groups/{live}/heartbeat",
                            json={"client_id": "c-1", "subscriptions": {topic: "TagA || TagB"}})
    assert resp.status_code == 200, resp.text
    resp = broker.http.put(f"/v1/groups/{committed_only}/offsets", json={"offsets": [
        {"topic": topic, "queue_id": 0, "offset": 1}, {"topic": other, "queue_id": 0,
                                                        "offset": 1}]})
    assert resp.status_code == 200, resp.text

    groups = groups_by_name(broker)
    assert groups[live] == {"group": live, "members": ["c-1"], "mode": "clustering",
                            "subscriptions": {topic: "TagA || TagB"}, "topics": [topic]}
    assert groups[committed_only] == {"group": committed_only, "members": [], "mode": None,
                                      "subscriptions": {}, "topics": sorted([topic, other])}
    names = list(groups)
    assert names == sorted(names)

    # a member that leaves no longer counts, but committed offsets keep the group known
    broker.http.put(f"/v1/groups/{live}/offsets",
                    json={"offsets": [{"topic": topic, "queue_id": 1, "offset": 1}]})
    broker.http.delete(f"/v1/groups/{live}/members/c-1")
    assert groups_by_name(broker)[live]["members"] == []
    assert groups_by_name(broker)[live]["topics"] == [topic]


# --- DELETE /v1/topics/{topic} -------------------------------------------------------------------

def test_delete_refuses_system_and_unknown_topics(broker: BrokerHandle) -> None:
    broker.error(broker.http.delete("/v1/topics/%25RETRY%25some-group"), 403,
                 "FORBIDDEN_SYSTEM_TOPIC")
    broker.error(broker.http.delete("/v1/topics/RMQ_SYS_TRANS_HALF_TOPIC"), 403,
                 "FORBIDDEN_SYSTEM_TOPIC")
    broker.error(broker.http.delete(f"/v1/topics/{unique('never')}"), 404, "TOPIC_NOT_FOUND")
    broker.error(broker.http.delete("/v1/topics/bad%20name"), 400, "INVALID_TOPIC_NAME")


def test_delete_topic_leaves_routes_and_keeps_messages_for_a_recreate(
        broker: BrokerHandle, nameserver: ServiceProcess) -> None:
    topic = broker.create_topic(queues=2)
    sent = broker.send(topic, {"body": "kept", "queue_id": 0})[0]
    assert httpx.get(f"{nameserver.url}/v1/routes/{topic}").status_code == 200

    resp = broker.http.delete(f"/v1/topics/{topic}")
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"deleted": topic, "queues": 2}
    # the nameservers forget it at once (no waiting for the next heartbeat)
    assert httpx.get(f"{nameserver.url}/v1/routes/{topic}").status_code == 404
    assert topic not in [t["name"] for t in broker.http.get("/v1/topics").json()["topics"]]
    broker.error(broker.http.get(f"/v1/topics/{topic}"), 404, "TOPIC_NOT_FOUND")
    broker.error(broker.http.post(f"/v1/topics/{topic}/messages",
                                  json={"messages": [{"body": "x"}]}), 404, "TOPIC_NOT_FOUND")
    broker.error(broker.http.get(f"/v1/topics/{topic}/queues/0/messages",
                                 params={"offset": 0}), 404, "TOPIC_NOT_FOUND")
    broker.error(broker.http.delete(f"/v1/topics/{topic}"), 404, "TOPIC_NOT_FOUND")

    # the stored message is still in the log; re-creating the topic continues its queues
    broker.create_topic(topic, queues=2)
    page = broker.pull(topic, 0)
    assert [m["message_id"] for m in page["messages"]] == [sent["message_id"]]
    assert broker.send(topic, {"body": "after", "queue_id": 0})[0]["queue_offset"] == 1


def test_a_deleted_topic_stays_deleted_after_a_restart(tmp_path: Path,
                                                       redis_server: RedisServer) -> None:
    with run_broker(tmp_path, redis_server.url) as broker:
        keep, drop = broker.create_topic(), broker.create_topic()
        assert broker.http.delete(f"/v1/topics/{drop}").status_code == 200
        broker.restart()
        names = [t["name"] for t in broker.http.get("/v1/topics").json()["topics"]]
        assert keep in names and drop not in names


# --- GET /v1/topics/{topic}?at_ms= ---------------------------------------------------------------

def test_offsets_at_a_time(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=2)
    broker.send(topic, {"body": "early", "queue_id": 0}, {"body": "early", "queue_id": 0})
    time.sleep(0.05)
    middle = now_ms()
    time.sleep(0.05)
    broker.send(topic, {"body": "late", "queue_id": 0})

    offsets = broker.http.get(f"/v1/topics/{topic}", params={"at_ms": middle}).json()["offsets"]
    assert offsets == [{"queue_id": 0, "min": 0, "max": 3, "at": 2},
                       {"queue_id": 1, "min": 0, "max": 0, "at": 0}]
    first = broker.http.get(f"/v1/topics/{topic}", params={"at_ms": 0}).json()["offsets"]
    assert first[0]["at"] == 0
    future = now_ms() + 60_000
    last = broker.http.get(f"/v1/topics/{topic}", params={"at_ms": future}).json()["offsets"]
    assert last[0]["at"] == 3
    assert "at" not in broker.http.get(f"/v1/topics/{topic}").json()["offsets"][0]
    broker.error(broker.http.get(f"/v1/topics/{topic}", params={"at_ms": -1}), 400,
                 "BAD_REQUEST")
