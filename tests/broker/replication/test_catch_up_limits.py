"""A replica left below its primary's retained log says so loudly (log, metric, /healthz);
under flush=sync the acknowledgement counts what the replica fsynced."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.conftest import RedisServer
from tests.support.replication import FAST, paused, run_group, status, wait_in_sync
from tests.support.wait import quiet_for, wait_until

pytestmark = pytest.mark.integration

SEGMENT = 64 * 1024


def test_a_replica_below_the_retained_log_says_so(tmp_path: Path,
                                                  redis_server: RedisServer) -> None:
    with run_group(tmp_path, redis_server.url, 2, replication="async", segment_bytes=SEGMENT,
                   file_reserved_hours=0.0002, retention_interval_s=0.2) as (primary, replica):
        wait_in_sync(primary, 2)
        topic = primary.create_topic(queues=1)
        with paused(replica):
            for i in range(80):  # ~160 KiB: the first segments roll and expire meanwhile
                primary.send(topic, {"body": f"{i}-" + "x" * 2000})
            wait_until(lambda: status(primary)["min_offset"] > 0, what="retention deleted")

        def unhealthy() -> bool:
            return httpx.get(replica.url + "/healthz", timeout=5).status_code == 503

        wait_until(unhealthy, what="the replica reports it is out of range")
        health = httpx.get(replica.url + "/healthz", timeout=5).json()
        assert "out of range" in health["message"]
        st = status(replica)
        assert st["out_of_range"] and st["log_end"] < status(primary)["min_offset"]
        assert "tidemq_broker_replication_out_of_range 1.0" in replica.http.get("/metrics").text
        assert "REPLICA OUT OF RANGE" in replica.proc.logs()
        # its refused fetches acknowledge nothing: out of sync once the lag time passes
        wait_until(lambda: status(primary)["in_sync_copies"] == 1, what="out of sync")
        # and stays so: five of its retries (100 ms apart) are refused and acknowledge nothing
        assert quiet_for(lambda: (status(primary)["in_sync_copies"],
                                  bool(status(replica)["out_of_range"])),
                         5 * FAST["replica_retry_ms"] / 1000, "out of sync") == (1, True)


def test_flush_sync_acknowledges_what_the_replica_fsynced(tmp_path: Path,
                                                          redis_server: RedisServer) -> None:
    with run_group(tmp_path, redis_server.url, 2, flush="sync") as (primary, replica):
        wait_in_sync(primary, 2)
        topic = primary.create_topic(queues=1)
        for i in range(5):
            primary.send(topic, {"body": f"m{i}"})
        end = status(primary)["log_end"]
        acked = status(primary)["replicas"][0]
        assert acked["flushed"] >= end or acked["written"] >= end  # held by both
        assert status(primary)["hwm"] == end
        wait_until(lambda: status(primary)["replicas"][0]["flushed"] == end,
                   what="the replica reports its fsync")
        wait_until(lambda: [m["body"] for m in replica.pull(topic, 0, 0)["messages"]] == [
            f"m{i}" for i in range(5)], timeout=2.0, what="the replica learns the HWM at once")
        # a retention floor set on the primary (a scheduler's progress) holds on the replica
        resp = primary.http.post("/internal/v1/retention-floor",
                                 json={"owner": "scheduler-x", "physical_offset": 0},
                                 headers={"x-tidemq-token": primary.env["TIDEMQ_BROKER_TOKEN"]})
        assert resp.status_code == 200, resp.text
        primary.send(topic, {"body": "wake the fetch"})
        checkpoint = replica.data_dir / "store" / "checkpoint"
        wait_until(lambda: json.loads(checkpoint.read_text())["retention_floors"].get(
            "scheduler-x") == 0, what="the replica keeps the primary's floor")
