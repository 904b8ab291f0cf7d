"""A cancel of a level message asked again after the walk passed it answers "cancelled", on real
processes (redis-server, broker, scheduler). The faults suite's open finding 3: the scheduler
cancelled a level-2 message, but the broker failed to record the cancel (its primary lost the
lease) and answered 503; the client asked again after the due time, when the walk had skipped
the message and forgotten its cancel, and the scheduler answered "delivered" — 409
ALREADY_DELIVERED for a message never delivered."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scheduler.harness import run_delay_cluster, unique
from tests.support.procs import RedisServer
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration

LEVELS = "1s 2s 3s"
CANCEL_PATH = "/internal/v1/timers/cancel"


def test_a_level_cancel_asked_again_after_the_walk_passed_it_is_still_cancelled(
        tmp_path: Path, redis_server: RedisServer) -> None:
    with run_delay_cluster(tmp_path, redis_server.url, levels=LEVELS) as cluster:
        topic = cluster.broker.create_topic(queues=1)
        gone, kept = unique("cancelled"), unique("kept")
        cluster.broker.send(topic, {"message_id": gone, "body": "gone", "delay_level": 1})
        cluster.broker.send(topic, {"message_id": kept, "body": "kept", "delay_level": 1})
        # what the broker asks the scheduler (the waiting copy: level 1, queue offset 0); the
        # broker is bypassed so that no cancel record of its own answers the repeat
        ask = {"message_id": gone, "topic": topic, "level": 1, "queue_offset": 0}
        first = cluster.sched.post(CANCEL_PATH, json=ask)
        assert first.status_code == 200 and first.json()["state"] == "cancelled", first.text
        # the walk passes both: the message after it is delivered
        wait_until(lambda: [m["message_id"] for m in cluster.broker.pull(topic, 0, 0)[
            "messages"]] == [kept], 15, "the walk past the cancelled message")
        again = cluster.sched.post(CANCEL_PATH, json=ask)
        assert again.status_code == 200 and again.json()["state"] == "cancelled", again.text
        # and the message delivered after it is reported delivered, as before
        late = cluster.sched.post(CANCEL_PATH, json={**ask, "message_id": kept,
                                                     "queue_offset": 1})
        assert late.status_code == 409 and late.json()["code"] == "ALREADY_DELIVERED", late.text
        assert [m["message_id"] for m in cluster.broker.pull(topic, 0, 0)["messages"]] == [kept]
