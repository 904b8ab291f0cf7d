"""Idempotent send: a retried batch with the same message ids stores nothing twice."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.support.broker import BrokerHandle, run_broker, unique
from tests.support.procs import RedisServer
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration


def batch(n: int, prefix: str) -> list[dict[str, Any]]:
    return [{"message_id": f"{prefix}-{i}", "body": f"body {i}", "queue_id": i % 2}
            for i in range(n)]


def stored(broker: BrokerHandle, topic: str, queues: int = 2) -> int:
    return sum(broker.pull(topic, q)["max_offset"] for q in range(queues))


def test_retried_batch_in_batch_and_concurrent_duplicates(tmp_path: Path,
                                                         redis_server: RedisServer) -> None:
    with run_broker(tmp_path, redis_server.url) as broker:
        topic = broker.create_topic(queues=2)
        messages = batch(10, unique("id"))
        first = broker.send(topic, *messages)
        assert broker.send(topic, *messages) == first  # the retry: same answers
        assert broker.send(topic, *reversed(messages)) == list(reversed(first))
        assert stored(broker, topic) == 10
        # the same id twice in one batch: stored once, both answered alike
        mid = unique("twice")
        one, two = broker.send(topic, {"message_id": mid, "body": "a"},
                               {"message_id": mid, "body": "a"})
        assert one == two and stored(broker, topic) == 11
        # a dedup is per topic: the same id in another topic is another message
        other = broker.create_topic(queues=2)
        broker.send(other, *messages)
        assert stored(broker, other) == 10
        # the same batch from 8 clients at once: stored once
        racing = batch(50, unique("race"))
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: broker.send(topic, *racing), range(8)))
        assert all(a == answers[0] for a in answers)
        assert stored(broker, topic) == 11 + 50


def test_dedup_survives_restart_and_map_eviction(tmp_path: Path,
                                                 redis_server: RedisServer) -> None:
    # a map of 4 entries: older ids are found through the store's unique-key index
    with run_broker(tmp_path, redis_server.url, dedup_max_entries=4) as broker:
        topic = broker.create_topic(queues=2)
        messages = batch(20, unique("id"))
        first = broker.send(topic, *messages)
        assert broker.send(topic, *messages) == first
        assert stored(broker, topic) == 20
        broker.restart()
        assert broker.send(topic, *messages) == first
        assert broker.send(topic, messages[3]) == [first[3]]
        assert stored(broker, topic) == 20


def test_dedup_window_expires(tmp_path: Path, redis_server: RedisServer) -> None:
    with run_broker(tmp_path, redis_server.url, dedup_window_s=1) as broker:
        topic = broker.create_topic(queues=2)
        messages = batch(2, unique("id"))
        first = broker.send(topic, *messages)
        assert broker.send(topic, *messages) == first
        # the same ids are answered from the window until it runs out, then stored anew
        again = wait_until(lambda: (answer := broker.send(topic, *messages)) != first and answer,
                           what="the dedup window to run out")
        assert [r["queue_offset"] for r in again] == [1, 1]  # stored anew after the window
        assert stored(broker, topic) == 4
