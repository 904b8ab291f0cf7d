"""Internal endpoints (token required): raw writes to system topics, raw reads, retention floor;
nameserver registration and topic auto-creation settings."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.broker import TOKEN, BrokerHandle, run_broker, unique
from tests.support.procs import RedisServer, ServiceProcess, free_port

pytestmark = pytest.mark.integration

AUTH = {"X-Tidemq-Token": TOKEN}
HALF = "RMQ_SYS_TRANS_HALF_TOPIC"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory,
           redis_server: RedisServer) -> Iterator[BrokerHandle]:
    with run_broker(tmp_path_factory.mktemp("internal"), redis_server.url) as handle:
        yield handle


def test_write_and_read_system_topic(broker: BrokerHandle) -> None:
    mid = unique("half")
    record = {"body": base64.b64encode(b"\xff\x00").decode(), "body_encoding": "base64",
              "properties": {"UNIQ_KEY": mid, "TAGS": "t", "REAL_TOPIC": "Orders",
                             "TRAN_MSG": "true"},
              "flag": 3, "born_timestamp_ms": 1234}
    resp = broker.http.post(f"/internal/v1/topics/{HALF}/messages", headers=AUTH,
                            json={"records": [record]})
    assert resp.status_code == 200, resp.text
    (result,) = resp.json()["results"]
    assert result["message_id"] == mid and result["topic"] == HALF
    names = [t["name"] for t in broker.http.get("/v1/topics").json()["topics"]]
    assert HALF in names  # created internally
    pulled = broker.http.get(f"/internal/v1/topics/{HALF}/queues/0/messages",
                             params={"offset": result["queue_offset"]}, headers=AUTH).json()
    raw = pulled["messages"][0]
    assert raw["properties"]["REAL_TOPIC"] == "Orders" and raw["flag"] == 3
    assert raw["born_timestamp_ms"] == 1234 and raw["physical_offset"] >= 0
    assert base64.b64decode(raw["body"]) == b"\xff\x00"
    one = broker.http.get(f"/internal/v1/records/{raw['physical_offset']}", headers=AUTH).json()
    assert one["message_id"] == mid
    # the public API may read a system topic, never write it
    public = broker.pull(HALF, 0, offset=result["queue_offset"])["messages"][0]
    assert public["message_id"] == mid and "REAL_TOPIC" not in public["properties"]
    # a re-put with dedup stores nothing twice
    again = broker.http.post(f"/internal/v1/topics/{HALF}/messages", headers=AUTH,
                             json={"records": [record], "dedup": True}).json()["results"]
    assert again == [result]
    resp = broker.http.post("/internal/v1/retention-floor", headers=AUTH,
                            json={"owner": "checker", "physical_offset": 0})
    assert resp.status_code == 200 and resp.json() == {}
    bad = broker.http.post(f"/internal/v1/topics/{HALF}/messages", headers=AUTH,
                           json={"records": [{"queue_id": 5}]})
    broker.error(bad, 400, "BAD_REQUEST")
    missing = broker.http.post(f"/internal/v1/topics/{unique('nope')}/messages", headers=AUTH,
                               json={"records": [{"body": "x"}]})
    broker.error(missing, 404, "TOPIC_NOT_FOUND")


def test_registers_topics_with_the_nameserver_and_auto_creates(
        tmp_path: Path, redis_server: RedisServer) -> None:
    port = free_port()
    nameserver = ServiceProcess("nameserver", port, {"TIDEMQ_NAMESRV_PORT": str(port)},
                                tmp_path).start()
    try:
        with run_broker(tmp_path, redis_server.url, nameservers=nameserver.url,
                        auto_create_topics="true", default_queues=3) as broker:
            topic = broker.create_topic(queues=2)
            route = httpx.get(f"{nameserver.url}/v1/routes/{topic}").json()
            assert [(q["address"], q["queues"], q["perm"]) for q in route["queues"]] == [
                (broker.url, 2, "rw")]
            auto = unique("Auto")
            assert broker.send(auto, {"body": "x"})[0]["queue_offset"] == 0
            assert broker.http.get(f"/v1/topics/{auto}").json()["queues"] == 3
            broker.error(broker.http.post("/v1/topics/%DLQ%x/messages",
                                          json={"messages": [{"body": "x"}]}),
                         403, "FORBIDDEN_SYSTEM_TOPIC")
    finally:
        nameserver.stop()
