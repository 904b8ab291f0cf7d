"""`tidemq group ... --cluster` against two broker groups sharing one Redis: offsets, lag and
resets per (broker, queue), and the group list of every broker."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tidemq import Producer, PushConsumer

from tests.support.procs import REPO, RedisServer
from tests.support.wait import wait_until_async
from tests.system.cluster_harness import ROUTE_REFRESH_S, run_sdk_groups
from tests.system.sdk_harness import FAST_CONSUMER, Recorder, unique

pytestmark = pytest.mark.integration


def cli(ns: str, *args: str) -> Any:
    done = subprocess.run([sys.executable, "-m", "tidemq_server.cli", "--nameserver", ns, *args,
                           "--json"], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, (done.stdout, done.stderr)
    return json.loads(done.stdout)


async def test_group_commands_cover_every_broker_group(tmp_path: Path,
                                                       redis_server: RedisServer) -> None:
    with run_sdk_groups(tmp_path, redis_server.url, nameservers=1) as groups:
        topic = groups.create_topic(queues=2)
        group = unique("G")
        recorder = Recorder()
        consumer = PushConsumer(group, handler=recorder.handler("c"), nameservers=groups.ns_urls,
                                route_refresh_s=ROUTE_REFRESH_S, **FAST_CONSUMER)
        consumer.subscribe(topic)
        async with consumer, Producer(nameservers=groups.ns_urls) as producer:
            await asyncio.gather(*(producer.send(f"m{i}", topic=topic) for i in range(40)))
            await wait_until_async(lambda: len(recorder.bodies()) == 40, 15, "consumption")
            await consumer.commit_offsets()
        ns = groups.ns_urls[0]

        rows = cli(ns, "group", "offsets", group, "--topic", topic, "--cluster")["offsets"]
        got = {(r["broker_name"], r["queue_id"]): (r["offset"], r["lag"]) for r in rows}
        expected = {(name, q): (end, 0) for name in ("broker-a", "broker-b")
                    for q, end in groups.max_offsets(name, topic).items()}
        assert got == expected
        listed = cli(ns, "group", "list", "--cluster")["groups"]
        assert sorted(g["broker_name"] for g in listed if g["group"] == group) == [
            "broker-a", "broker-b"]

        reset = cli(ns, "group", "reset", group, "--topic", topic, "--to", "earliest",
                    "--cluster")["offsets"]
        assert {(r["broker_name"], r["queue_id"], r["offset"]) for r in reset} == {
            (name, q, 0) for name, q in expected}
        for name in ("broker-a", "broker-b"):
            assert groups.committed(name, group, topic) == {0: 0, 1: 0}
