"""A replicated broker group of real processes: a primary and two replicas on loopback."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import httpx
import pytest
from tidemq.protocol import decode_payload

from tests.conftest import RedisServer
from tests.support.broker import TOKEN, BrokerHandle, unique
from tests.support.procs import ServiceProcess, free_port
from tests.support.replication import read_log, run_group, send_raw, status, wait_in_sync
from tests.support.wait import wait_until
from tidemq_server.broker.replication.chunkwire import CONTENT_CHUNK, FETCH_ACCEPT, parse_chunk

pytestmark = pytest.mark.integration

SEGMENT = 64 * 1024  # small segments: the copies must roll at the same offsets
N = 110  # messages of ~2.1 KiB: more than three segments


def test_sync_sends_are_byte_identical_at_the_same_offsets_on_every_copy(
        tmp_path: Path, redis_server: RedisServer) -> None:
    with run_group(tmp_path, redis_server.url, 3, segment_bytes=SEGMENT) as group:
        primary, r1, r2 = group
        wait_in_sync(primary, 3)
        topic = primary.create_topic(queues=2)
        blob = base64.b64encode(bytes(range(256)) * 8).decode()
        sent = []
        for i in range(N):  # ~2.1 KiB each: the 64 KiB segments roll several times
            sent += primary.send(topic, {"body": blob, "body_encoding": "base64",
                                         "message_id": f"m-{i}", "keys": [f"k{i}"],
                                         "queue_id": i % 2})
        batch = primary.send(topic, *({"body": f"b{j}", "queue_id": 1} for j in range(20)))
        end = status(primary)["log_end"]
        assert end > 3 * SEGMENT
        for replica in (r1, r2):
            wait_until(lambda r=replica: status(r)["log_end"] == end, what="replica caught up")
        logs = [read_log(b) for b in group]
        assert logs[0] == logs[1] == logs[2]
        assert len(logs[0]) >= 4  # one chunk per segment at least: same segment boundaries
        for replica in (r1, r2):  # slave read: same messages at the same queue offsets
            wait_until(lambda r=replica: status(r)["hwm"] == end, what="replica learns the HWM")
            assert topic in [t["name"] for t in replica.http.get("/v1/topics").json()["topics"]]
            for qid in (0, 1):
                mine = primary.pull(topic, qid, 0, max=1024)["messages"]
                theirs = replica.pull(topic, qid, 0, max=1024)["messages"]
                assert [(m["message_id"], m["queue_offset"]) for m in theirs] == \
                    [(m["message_id"], m["queue_offset"]) for m in mine]
            got = replica.http.get("/v1/messages/m-7").json()
            assert got["queue_offset"] == sent[7]["queue_offset"]
        assert [r["queue_offset"] for r in batch] == list(range(N // 2, N // 2 + 20))
        st = status(primary)
        assert st["in_sync_copies"] == 3 and st["hwm"] == end
        assert all(r["lag_bytes"] == 0 for r in st["replicas"])
        metrics = primary.http.get("/metrics").text
        assert "tidemq_broker_replication_hwm" in metrics
        assert 'tidemq_broker_replication_replica_lag_bytes{address=' in metrics
        # the same fetch in both forms (broker 9: no copy's acknowledgement moves)
        asked = {"from": SEGMENT, "broker_id": 9, "epoch": st["epoch"], "max_bytes": 8192}
        token = {"x-tidemq-token": TOKEN}
        packed = primary.http.get("/internal/v1/replication/fetch", params=asked,
                                  headers={**token, "accept": "application/msgpack"})
        raw = primary.http.get("/internal/v1/replication/fetch", params=asked,
                               headers={**token, "accept": FETCH_ACCEPT})
        assert raw.headers["content-type"] == CONTENT_CHUNK
        want = decode_payload(packed.content, packed.headers["content-type"])
        assert len(want["data"]) > 4096 and want["floors"] is not None
        assert parse_chunk(raw.headers, raw.content) == want


def test_a_replica_registers_as_one_and_refuses_writes_naming_the_primary(
        tmp_path: Path, redis_server: RedisServer) -> None:
    port = free_port()
    nameserver = ServiceProcess("nameserver", port, {
        "TIDEMQ_NAMESRV_PORT": str(port), "TIDEMQ_NAMESRV_TOKEN": TOKEN}, tmp_path).start()
    try:
        with run_group(tmp_path, redis_server.url, 2, nameservers=nameserver.url,
                       register_interval_s=0.5) as (primary, replica):
            wait_in_sync(primary, 2)
            topic = primary.create_topic(queues=1)
            wait_until(lambda: replica.http.get(f"/v1/topics/{topic}").status_code == 200,
                       what="the topic reaches the replica")
            route: dict[str, Any] = {}

            def routed() -> bool:
                resp = httpx.get(f"{nameserver.url}/v1/routes/{topic}")
                route.update(resp.json() if resp.status_code == 200 else {})
                return bool(route.get("queues")) and bool(route["queues"][0]["replicas"])

            wait_until(routed, what="the route lists the replica")
            assert [(q["address"], q["replicas"]) for q in route["queues"]] == [
                (primary.url, [replica.url])]
            members = {b["address"]: b for b in
                       httpx.get(f"{nameserver.url}/v1/cluster").json()["brokers"]}
            assert (members[replica.url]["role"], members[replica.url]["broker_id"],
                    members[replica.url]["epoch"]) == ("replica", 1, 1)
            assert (members[primary.url]["role"], members[primary.url]["epoch"]) == (
                "primary", 1)
            refuses_writes(primary, replica, topic)
    finally:
        nameserver.stop()


def refuses_writes(primary: BrokerHandle, replica: BrokerHandle, topic: str) -> None:
    message = replica.error(send_raw(replica, topic, {"body": "x"}), 503, "NOT_PRIMARY")
    assert primary.url in message
    resp = replica.http.put(f"/v1/topics/{unique('T')}", json={"queues": 1})
    assert primary.url in replica.error(resp, 503, "NOT_PRIMARY")
    resp = replica.http.post("/v1/transactions", json={"producer_group": "g", "topic": topic,
                                                       "message": {"body": "half"}})
    replica.error(resp, 503, "NOT_PRIMARY")
    assert replica.pull(topic, 0)["max_offset"] == 0
