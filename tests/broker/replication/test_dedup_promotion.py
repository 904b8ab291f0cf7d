"""A retry after NOT_ENOUGH_REPLICAS stores nothing twice: on the same primary, and across a
promotion of the replica that copied the record above its high-water mark (found by the first
faults run between namespace hosts: the dedup lookup saw only records below the HWM)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import RedisServer
from tests.support.replication import (
    bodies,
    hand_over,
    paused,
    run_group,
    send_raw,
    set_role,
    status,
    wait_in_sync,
    wait_until,
)

pytestmark = pytest.mark.integration


def test_a_retried_send_is_stored_once_on_the_primary_and_after_a_promotion(
        tmp_path: Path, redis_server: RedisServer) -> None:
    # every copy must hold a record before it is acknowledged: one stopped replica is enough
    # to leave a record written on two copies but unacknowledged
    with run_group(tmp_path, redis_server.url, 3, min_insync=3) as (old, r1, r2):
        wait_in_sync(old, 3)
        topic = old.create_topic(queues=1)
        assert old.send(topic, {"body": "A", "message_id": "id-A"})[0]["queue_offset"] == 0

        # 1. same primary: the first write stays in the log unacknowledged; the retry finds it
        with paused(r2):
            first = send_raw(old, topic, {"body": "B0", "message_id": "id-B0"})
            old.error(first, 503, "NOT_ENOUGH_REPLICAS")
        wait_in_sync(old, 3)
        assert old.send(topic, {"body": "B0", "message_id": "id-B0"})[0]["queue_offset"] == 1
        wait_until(lambda: status(old)["hwm"] == status(old)["log_end"], what="B0 covered")

        # a half message likewise: its retry is answered only once a quorum holds the first
        # copy (the faults suite saw a retried half acknowledged by an isolated primary)
        half = {"producer_group": "pg", "topic": topic,
                "message": {"body": "H", "message_id": "id-H"}}
        with paused(r2):
            old.error(old.http.post("/v1/transactions", json=half), 503, "NOT_ENOUGH_REPLICAS")
            old.error(old.http.post("/v1/transactions", json=half), 503, "NOT_ENOUGH_REPLICAS")
        wait_in_sync(old, 3)
        answer = old.http.post("/v1/transactions", json=half)
        assert answer.status_code == 200, answer.text
        txid = answer.json()["transaction_id"]
        ended = old.http.post(f"/v1/transactions/{txid}/end",
                              json={"producer_group": "pg", "action": "commit"})
        assert ended.json() == {"state": "committed"}, ended.text
        wait_until(lambda: bodies(old, topic) == ["A", "B0", "H"], what="H committed once")

        # 2. promotion: r1 copied B above its HWM; old is demoted, r1 promoted, then the retry
        with paused(r2):
            first = send_raw(old, topic, {"body": "B", "message_id": "id-B"})
            old.error(first, 503, "NOT_ENOUGH_REPLICAS")
            end = status(old)["log_end"]
            wait_until(lambda: status(r1)["log_end"] == end, what="B copied to r1")
            assert status(r1)["hwm"] < end  # above r1's high-water mark
            hand_over(old, r1, 2)
        set_role(r2, "replica", 2, r1.url)
        wait_in_sync(r1, 3)
        again = r1.send(topic, {"body": "B", "message_id": "id-B"})
        assert again[0]["queue_offset"] == 3  # the first copy's place: not stored again
        wait_until(lambda: status(r1)["hwm"] == status(r1)["log_end"], what="B covered")
        assert bodies(r1, topic) == ["A", "B0", "H", "B"]
        assert status(r1)["log_end"] == end  # nothing written by the retry
