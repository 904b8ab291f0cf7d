"""`tidemq up --replicas 3` for real: one group of three brokers on predictable ports, the
replicas registered as such and following the primary."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.support.broker import unique
from tests.support.up import UpRun, free_base

pytestmark = pytest.mark.integration


def test_up_runs_a_primary_and_two_replicas(tmp_path: Path) -> None:
    ns, checker, scheduler = free_base(1, 1), free_base(1, 1), free_base(1, 1)
    broker = free_base(3, 100)
    up = UpRun(tmp_path, "--replicas", "3", "--nameserver-port", str(ns),
               "--broker-port", str(broker), "--checker-port", str(checker),
               "--scheduler-port", str(scheduler), "--grpc-port", "0", "--no-metrics",
               "--skip", "console", "--stop-timeout", "20")
    try:
        up.wait_ready(150)
        urls = [f"http://127.0.0.1:{broker + 100 * j}" for j in range(3)]
        for name in ("broker-r1", "broker-r2", urls[1], urls[2]):
            assert name in up.output()
        view = httpx.get(f"http://127.0.0.1:{ns}/v1/cluster", timeout=5).json()
        members = {b["address"]: (b["broker_name"], b["role"], b["broker_id"])
                   for b in view["brokers"]}
        assert members == {urls[0]: ("broker-a", "primary", 0),
                           urls[1]: ("broker-a", "replica", 1),
                           urls[2]: ("broker-a", "replica", 2)}
        topic = unique("Up")
        assert httpx.put(f"{urls[0]}/v1/topics/{topic}", json={"queues": 1}).status_code == 200
        sent = httpx.post(f"{urls[0]}/v1/topics/{topic}/messages", timeout=10,
                          json={"messages": [{"body": "copied"}]})
        assert sent.status_code == 200, sent.text
        for url in urls[1:]:
            for _ in range(100):
                resp = httpx.get(f"{url}/v1/topics/{topic}/queues/0/messages", timeout=5)
                if resp.status_code == 200 and resp.json()["messages"]:
                    break
                time.sleep(0.1)
            assert [m["body"] for m in resp.json()["messages"]] == ["copied"]
        assert up.stop() == 0, up.output()
    finally:
        up.kill()
