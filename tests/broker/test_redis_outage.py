"""Redis holds consumer offsets: an outage never stops sends, a restart loses no commit."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.broker import BrokerHandle, run_broker, unique
from tests.support.procs import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def commit(broker: BrokerHandle, group: str, topic: str, queue_id: int, offset: int) -> int:
    resp = broker.http.put(f"/v1/groups/{group}/offsets",
                           json={"offsets": [{"topic": topic, "queue_id": queue_id,
                                              "offset": offset}]})
    return resp.status_code


def test_redis_restart_loses_no_committed_offset(tmp_path: Path,
                                                 private_redis: RedisServer) -> None:
    with run_broker(tmp_path, private_redis.url) as broker:
        topic = broker.create_topic(queues=4)
        broker.send(topic, *({"body": str(i), "queue_id": i % 4} for i in range(40)))
        group = unique("G")
        for q in range(4):
            assert commit(broker, group, topic, q, q + 1) == 200
        private_redis.stop(signal.SIGTERM)
        private_redis.start()
        got = broker.http.get(f"/v1/groups/{group}/offsets", params={"topic": topic}).json()
        assert [(o["queue_id"], o["offset"], o["lag"]) for o in got["offsets"]] == [
            (q, q + 1, 10 - q - 1) for q in range(4)]


def test_sends_keep_working_while_redis_is_down(tmp_path: Path,
                                                private_redis: RedisServer) -> None:
    with run_broker(tmp_path, private_redis.url) as broker:
        topic = broker.create_topic(queues=2)
        group = unique("G")
        assert commit(broker, group, topic, 0, 0) == 200
        private_redis.stop()
        results = broker.send(topic, *({"body": str(i)} for i in range(20)))
        assert len(results) == 20
        assert sum(len(broker.pull(topic, q)["messages"]) for q in range(2)) == 20
        resp = broker.http.put(f"/v1/groups/{group}/offsets",
                               json={"offsets": [{"topic": topic, "queue_id": 0, "offset": 1}]})
        broker.error(resp, 503, "UNAVAILABLE")
        resp = broker.http.get(f"/v1/groups/{group}/offsets", params={"topic": topic})
        broker.error(resp, 503, "UNAVAILABLE")
        private_redis.start()  # same port, same data: the client reconnects by itself
        assert commit(broker, group, topic, 0, 1) == 200
        got = broker.http.get(f"/v1/groups/{group}/offsets", params={"topic": topic}).json()
        assert [(o["queue_id"], o["offset"]) for o in got["offsets"]] == [(0, 1)]
