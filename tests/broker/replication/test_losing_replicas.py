"""A replicated group losing replicas: acknowledgement with fewer copies, NOT_ENOUGH_REPLICAS,
reads going on, catching up after a restart, and what consumers may see (the high-water mark)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import RedisServer
from tests.support.replication import (
    bodies,
    paused,
    read_log,
    run_group,
    send_raw,
    status,
    wait_in_sync,
)
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration


def test_replicas_dying_and_coming_back(tmp_path: Path, redis_server: RedisServer) -> None:
    with run_group(tmp_path, redis_server.url, 3, min_insync=2) as group:
        primary, r1, r2 = group
        wait_in_sync(primary, 3)
        topic = primary.create_topic(queues=1)
        primary.send(topic, {"body": "all three"})
        r1.proc.kill()
        primary.send(topic, {"body": "two left"})  # primary + r2 = min_insync
        r2.proc.kill()
        wait_until(lambda: status(primary)["in_sync_copies"] == 1, what="replicas out of sync")
        code = primary.error(send_raw(primary, topic, {"body": "alone"}), 503,
                             "NOT_ENOUGH_REPLICAS")
        assert "min_insync is 2" in code
        assert bodies(primary, topic) == ["all three", "two left"]  # reads go on
        primary.restart()  # alone: its saved high-water mark keeps both visible
        assert bodies(primary, topic) == ["all three", "two left"]
        r1.proc.start()  # catches up by streaming what it missed
        wait_in_sync(primary, 2)
        primary.send(topic, {"body": "back to two"})
        wait_until(lambda: status(r1)["log_end"] == status(primary)["log_end"],
                   what="restarted replica caught up")
        assert read_log(r1) == read_log(primary)
        wait_until(lambda: bodies(r1, topic) == ["all three", "two left", "back to two"],
                   what="the restarted replica serves every acknowledged message")


def test_consumers_never_see_records_above_the_high_water_mark(
        tmp_path: Path, redis_server: RedisServer) -> None:
    with run_group(tmp_path, redis_server.url, 2) as (primary, replica):
        wait_in_sync(primary, 2)
        topic = primary.create_topic(queues=1)
        primary.send(topic, {"body": "safe"})
        with paused(replica):
            primary.error(send_raw(primary, topic, {"body": "primary only"}), 503,
                          "NOT_ENOUGH_REPLICAS")
            answer = primary.pull(topic, 0, 0, max=32)
            assert [m["body"] for m in answer["messages"]] == ["safe"]
            assert answer["max_offset"] == 1  # the queue ends at the high-water mark
            assert primary.http.get("/v1/messages", params={"topic": topic}).status_code in (
                200, 400)
            held: dict[str, Any] = {}

            def long_poll() -> None:
                held.update(primary.pull(topic, 0, 1, wait_ms=10_000))

            waiter = threading.Thread(target=long_poll)
            waiter.start()
            time.sleep(0.3)
            assert not held  # held: the record exists on the primary only
        waiter.join(15)
        assert [m["body"] for m in held["messages"]] == ["primary only"]  # visible once copied
        wait_in_sync(primary, 2)
        assert bodies(replica, topic) == ["safe", "primary only"]
