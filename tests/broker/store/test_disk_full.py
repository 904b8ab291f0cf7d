"""A full disk under a running broker (a small tmpfs as its data directory, so root only): sends
are refused with 503 DISK_FULL and nothing half-written, the broker stays up, and it takes
sends again by itself once space returns; everything acknowledged is still there."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench._faults.nemesis import fill
from tests.conftest import RedisServer
from tests.support.broker import run_broker

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs (needs root)")]

TMPFS_MB = 24


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_MB}m", "tidemq-test", str(mount)],
                   check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_refuses_sends_and_resumes_when_space_returns(
        small_disk: Path, redis_server: RedisServer) -> None:
    with run_broker(small_disk, redis_server.url, segment_bytes=1024 * 1024,
                    retention_interval_s=0.2) as broker:
        topic = broker.create_topic(queues=2)
        acked = [r["message_id"] for r in broker.send(
            topic, *({"message_id": f"before-{i}", "body": "x" * 200} for i in range(50)))]
        filler = small_disk / "filler"
        fill(filler)
        refused = 0
        for i in range(10):  # new records need new index, queue and log pages: none is left
            resp = broker.http.post(f"/v1/topics/{topic}/messages", json={"messages": [
                {"message_id": f"full-{i}", "body": "y" * 2000}]})
            if resp.status_code == 200:
                acked.append(f"full-{i}")
            else:
                assert resp.status_code == 503, resp.text
                assert resp.json()["code"] in ("DISK_FULL", "BROKER_BUSY"), resp.text
                refused += 1
        assert refused > 0
        assert broker.proc.proc is not None and broker.proc.proc.poll() is None  # still up
        assert broker.http.get("/healthz").status_code == 200
        filler.unlink()
        deadline = time.monotonic() + 15
        while True:  # resumes by itself
            resp = broker.http.post(f"/v1/topics/{topic}/messages", json={"messages": [
                {"message_id": "after", "body": "z"}]})
            if resp.status_code == 200:
                acked.append("after")
                break
            assert time.monotonic() < deadline, resp.text
            time.sleep(0.2)
        stored = [m["message_id"] for q in range(2)
                  for m in broker.pull(topic, q, 0, max=1024)["messages"]]
        assert sorted(stored) == sorted(acked)  # every ack kept, nothing refused stored
        broker.restart()  # and the files recover cleanly
        again = [m["message_id"] for q in range(2)
                 for m in broker.pull(topic, q, 0, max=1024)["messages"]]
        assert sorted(again) == sorted(acked)

