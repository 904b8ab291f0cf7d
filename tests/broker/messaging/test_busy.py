"""Flow control: with a tiny write backlog allowed, concurrent sends get 503 BROKER_BUSY with
Retry-After, and every acknowledged message is stored."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.support.broker import run_broker
from tests.support.procs import RedisServer

pytestmark = pytest.mark.integration


def test_broker_busy_under_load(tmp_path: Path, redis_server: RedisServer) -> None:
    with run_broker(tmp_path, redis_server.url, max_pending_bytes=1, max_send_wait_ms=1,
                    flush="sync") as broker:
        topic = broker.create_topic(queues=4)
        body = {"messages": [{"body": "x" * 4096} for _ in range(32)]}

        def send(_: int) -> httpx.Response:
            with httpx.Client(base_url=broker.url, timeout=30) as client:
                return client.post(f"/v1/topics/{topic}/messages", json=body)

        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(send, range(160)))
        busy = [r for r in answers if r.status_code == 503]
        ok = [r for r in answers if r.status_code == 200]
        assert len(busy) + len(ok) == len(answers)
        assert busy, "no send was refused"
        assert ok, "every send was refused"
        for resp in busy:
            assert resp.json()["code"] == "BROKER_BUSY" and resp.json()["message"]
            assert int(resp.headers["Retry-After"]) >= 1
        stored = sum(broker.pull(topic, q)["max_offset"] for q in range(4))
        assert stored == 32 * len(ok)
        metrics = broker.http.get("/metrics").text
        line = next(x for x in metrics.splitlines()
                    if x.startswith("tidemq_broker_busy_rejections_total"))
        assert float(line.split()[-1]) == len(busy)
