"""A broker restart (clean or killed) keeps topics, messages and committed offsets; SIGTERM is
clean and releases held pulls at once."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.support.broker import run_broker, unique
from tests.support.procs import RedisServer
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_restart_keeps_messages_topics_and_offsets(tmp_path: Path, redis_server: RedisServer,
                                                   sig: int) -> None:
    with run_broker(tmp_path, redis_server.url) as broker:
        topic = broker.create_topic(queues=3)
        sent = broker.send(topic, *({"body": f"m{i}", "message_id": f"{topic}-{i}",
                                     "keys": [f"k{i}"]} for i in range(30)))
        group = unique("G")
        resp = broker.http.put(f"/v1/groups/{group}/offsets",
                               json={"offsets": [{"topic": topic, "queue_id": 1, "offset": 4}]})
        assert resp.status_code == 200
        broker.restart(sig)
        assert broker.http.get(f"/v1/topics/{topic}").json()["queues"] == 3
        bodies = sorted(m["body"] for q in range(3)
                        for m in broker.pull(topic, q, max=100)["messages"])
        assert bodies == sorted(f"m{i}" for i in range(30))
        assert broker.http.get(f"/v1/messages/{topic}-7").json()["body"] == "m7"
        found = broker.http.get("/v1/messages", params={"topic": topic, "key": "k8"}).json()
        assert [m["body"] for m in found["messages"]] == ["m8"]
        offsets = broker.http.get(f"/v1/groups/{group}/offsets", params={"topic": topic}).json()
        assert [(o["queue_id"], o["offset"]) for o in offsets["offsets"]] == [(1, 4)]
        # sending continues where it stopped
        again = broker.send(topic, {"body": "after", "queue_id": 0})
        per_queue = sum(1 for r in sent if r["queue_id"] == 0)
        assert again[0]["queue_offset"] == per_queue


def test_sigterm_is_clean_and_releases_long_polls(tmp_path: Path,
                                                  redis_server: RedisServer) -> None:
    with run_broker(tmp_path, redis_server.url) as broker:
        topic = broker.create_topic(queues=1)
        answer: dict[str, Any] = {}

        def hold() -> None:
            answer.update(broker.pull(topic, 0, wait_ms=30_000))

        waiter = threading.Thread(target=hold)
        waiter.start()
        wait_until(lambda: broker.held_pulls() == 1, what="the pull held")
        # a pull the SIGTERM did not release would hold the shutdown for its 30 s: stop()
        # SIGKILLs after 15 s, which cuts the pull off and shows in the exit code
        code = broker.proc.stop(signal.SIGTERM)
        waiter.join()
        assert answer.get("messages") == []  # answered, not cut off
        assert code in (0, -signal.SIGTERM)
        logs = broker.proc.logs()
        assert "broker broker-a stopped" in logs and "Traceback" not in logs
        broker.proc.start()  # the harness stops it again
