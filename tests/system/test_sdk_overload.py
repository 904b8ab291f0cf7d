"""Overload: a broker allowed almost no write backlog answers a flood of sends with 503
BROKER_BUSY (Retry-After), and the SDK's back-off gets every send through, stored once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from tidemq import BrokerBusyError, Producer, RetryPolicy, SendResult

from tests.support.procs import RedisServer
from tests.system.sdk_harness import run_cluster

pytestmark = pytest.mark.integration

SENDS = 600
BODY = "x" * 4096


async def test_flood_gets_broker_busy_and_every_send_succeeds(
        tmp_path: Path, redis_server: RedisServer) -> None:
    with run_cluster(tmp_path, redis_server.url, max_pending_bytes=1, max_send_wait_ms=1,
                     flush="sync") as cluster:
        topic = cluster.create_topic(queues=4)
        # Small batches → many concurrent requests. A 1-byte backlog refuses nearly every
        # overlap, so on a loaded machine a request may be refused many times: no attempt count,
        # only a deadline (as by default), longer than the default 30 s for a loaded machine.
        retry = RetryPolicy(deadline_s=90.0)
        started = time.monotonic()
        async with Producer(nameservers=cluster.nameservers, max_batch=4, max_in_flight=64,
                            retry=retry) as producer:
            answers = await asyncio.gather(
                *(producer.send(f"{i}:{BODY}", topic=topic) for i in range(SENDS)),
                return_exceptions=True)
        elapsed = time.monotonic() - started

        busy = cluster.metric("tidemq_broker_busy_rejections_total")
        failures = [a for a in answers if isinstance(a, BaseException)]
        assert not failures, f"{len(failures)} sends failed, e.g. {failures[0]!r}"
        results = [a for a in answers if isinstance(a, SendResult)]
        assert len(results) == SENDS
        assert busy > 0, "the flood never got BROKER_BUSY: the test does not exercise back-off"
        assert elapsed >= 1.0, "a BROKER_BUSY answer's Retry-After (>= 1 s) was not honoured"
        assert len({r.message_id for r in results}) == SENDS
        assert len({(r.queue_id, r.queue_offset) for r in results}) == SENDS
        assert sum(cluster.max_offsets(topic).values()) == SENDS, "a retried send stored twice"

        # without retries the same flood surfaces BROKER_BUSY to the caller
        async with Producer(nameservers=cluster.nameservers, max_batch=4, max_in_flight=64,
                            retry=RetryPolicy(max_attempts=1)) as producer:
            answers = await asyncio.gather(
                *(producer.send(f"{i}:{BODY}", topic=topic) for i in range(SENDS)),
                return_exceptions=True)
        refused = [a for a in answers if isinstance(a, BrokerBusyError)]
        stored = [a for a in answers if isinstance(a, SendResult)]
        assert refused and len(refused) + len(stored) == SENDS
        assert all(e.retry_after is not None and e.retry_after >= 1 for e in refused)
        assert sum(cluster.max_offsets(topic).values()) == SENDS + len(stored)
