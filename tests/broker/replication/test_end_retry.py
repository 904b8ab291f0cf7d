"""A commit retried after NOT_ENOUGH_REPLICAS stores the message once: on the same primary, and
on a promoted replica that copied the first commit above its high-water mark (the faults
suite's open finding 2: a committed transaction stored twice in broker-a during the bridge
partition — the retry's transaction load saw only the log below the HWM, so it took the
transaction for pending and wrote a second commit copy, which the quorum then confirmed with
the first)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import RedisServer
from tests.support.replication import (
    bodies,
    hand_over,
    paused,
    run_group,
    set_role,
    status,
    wait_in_sync,
    wait_until,
)

pytestmark = pytest.mark.integration


def _half(broker: Any, topic: str, mid: str) -> str:
    answer = broker.http.post("/v1/transactions", json={
        "producer_group": "pg", "topic": topic, "message": {"body": mid, "message_id": mid}})
    assert answer.status_code == 200, answer.text
    return str(answer.json()["transaction_id"])


def _commit(broker: Any, txid: str) -> Any:
    return broker.http.post(f"/v1/transactions/{txid}/end",
                            json={"producer_group": "pg", "action": "commit"})


def test_a_retried_commit_is_stored_once_on_the_primary_and_after_a_promotion(
        tmp_path: Path, redis_server: RedisServer) -> None:
    # every copy must hold a record before it is acknowledged: one stopped replica leaves a
    # commit written on two copies but unacknowledged; it counts as in sync for 30 s, so the
    # gate lets the retry through (as a replica back from a partition that has not yet
    # confirmed the first copy): the retry must decide on the whole log, not the part below
    # the high-water mark
    with run_group(tmp_path, redis_server.url, 3, min_insync=3, replica_lag_max_ms=30_000,
                   sync_ack_timeout_ms=1000) as (old, r1, r2):
        wait_in_sync(old, 3)
        topic = old.create_topic(queues=1)

        # 1. same primary: the commit stays in the log unacknowledged; the retry (while the
        # replica is still away, then after it is back) writes no second copy
        first = _half(old, topic, "C1")
        with paused(r2):
            old.error(_commit(old, first), 503, "NOT_ENOUGH_REPLICAS")
            end = status(old)["log_end"]
            old.error(_commit(old, first), 503, "NOT_ENOUGH_REPLICAS")
            assert status(old)["log_end"] == end  # the retry wrote nothing
        wait_in_sync(old, 3)
        again = _commit(old, first)
        assert again.status_code == 200 and again.json() == {"state": "committed"}, again.text
        assert status(old)["log_end"] == end
        wait_until(lambda: bodies(old, topic) == ["C1"], what="C1 committed")
        assert bodies(old, topic) == ["C1"]

        # 2. promotion: r1 copied the commit above its HWM; old is demoted, r1 promoted, then
        # the producer's retry reaches r1
        second = _half(old, topic, "C2")
        wait_until(lambda: status(r1)["log_end"] == status(old)["log_end"], what="C2 copied")
        with paused(r2):
            old.error(_commit(old, second), 503, "NOT_ENOUGH_REPLICAS")
            end = status(old)["log_end"]
            wait_until(lambda: status(r1)["log_end"] == end, what="the commit copied to r1")
            assert status(r1)["hwm"] < end  # above r1's high-water mark
            hand_over(old, r1, 2)
        set_role(r2, "replica", 2, r1.url)
        wait_in_sync(r1, 3)
        again = _commit(r1, second)
        assert again.status_code == 200 and again.json() == {"state": "committed"}, again.text
        wait_until(lambda: status(r1)["hwm"] == status(r1)["log_end"], what="all covered")
        assert bodies(r1, topic) == ["C1", "C2"]
        assert status(r1)["log_end"] == end  # nothing written by the retry
