"""Real transactions → TIDE_SYS_TRANS_EVENTS → the Spark job → exact counts and buckets.

A broker and a checker (short check interval, 3 checks before a discard) run as processes; a
`TransactionProducer` commits, rolls back, answers UNKNOWN and then commit on the first check,
and answers UNKNOWN to every check until the message is discarded. The job's exposition must
match the counts the script implies and, sample for sample, the plain-Python aggregation of
the very events the broker wrote.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tidemq import TransactionProducer, TransactionState

from tests.metrics.test_job import expected, run_once, without_batch
from tests.support.broker import BrokerHandle, unique
from tests.support.metrics import sample
from tests.support.procs import RedisServer, ServiceProcess, free_port
from tidemq_server.common.constants import TOKEN_HEADER
from tidemq_server.metrics.planning import QueueRange
from tidemq_server.metrics.reader import TopicReader

pytestmark = pytest.mark.integration

EVENTS = "TIDE_SYS_TRANS_EVENTS"
CHECK_MAX = 3


@pytest.fixture(scope="module")
def checker(events_broker: BrokerHandle, redis_server: RedisServer,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    port = free_port()
    env = {
        "TIDEMQ_CHECKER_PORT": str(port),
        "TIDEMQ_CHECKER_BROKER_URL": events_broker.url,
        "TIDEMQ_CHECKER_REDIS_URL": redis_server.url,
        "TIDEMQ_CHECKER_TOKEN": events_broker.env["TIDEMQ_BROKER_TOKEN"],
        "TIDEMQ_CHECKER_CLUSTER": events_broker.env["TIDEMQ_BROKER_CLUSTER"],
        "TIDEMQ_CHECKER_CHECK_INTERVAL_MS": "200",
        "TIDEMQ_CHECKER_TRANSACTION_TIMEOUT_MS": "300",
        "TIDEMQ_CHECKER_CHECK_MAX": str(CHECK_MAX),
    }
    proc = ServiceProcess("checker", port, env, tmp_path_factory.mktemp("checker")).start()
    yield proc
    proc.stop()


def _text(body: str | bytes) -> str:
    return body.decode() if isinstance(body, bytes) else body


class ScriptedListener:
    """The body says what to do: ``<execute answer>:<answer to every check>:<n>``."""

    async def execute_local_transaction(self, message: Any, arg: Any) -> TransactionState:
        return TransactionState(_text(message.body).split(":")[0])

    async def check_local_transaction(self, message: Any) -> TransactionState:
        return TransactionState(_text(message.body).split(":")[1])


PLAN = [("commit", "commit")] * 3 + [("rollback", "rollback")] * 2 + [
    ("unknown", "commit"),  # ended by the first check
    ("unknown", "unknown"),  # checked CHECK_MAX times, then discarded
]


async def run_transactions(broker: BrokerHandle, group: str, topic: str) -> list[str]:
    async with TransactionProducer(group, ScriptedListener(), broker_url=broker.url,
                                   heartbeat_interval_s=1.0, check_wait_ms=500) as producer:
        results = await asyncio.gather(*[
            producer.send(f"{first}:{then}:{i}", topic=topic)
            for i, (first, then) in enumerate(PLAN)])
        ids = [r.message_id for r in results]
        final = {"commit": "committed", "rollback": "rolled_back"}
        wanted = {mid: final.get(then, "discarded") for mid, (_, then) in zip(ids, PLAN,
                                                                              strict=True)}
        deadline = time.monotonic() + 60
        async with httpx.AsyncClient(base_url=broker.url) as http:
            while True:
                states = {mid: (await http.get(f"/v1/messages/{mid}")).json().get("state")
                          for mid in ids}
                if states == wanted:
                    return ids
                assert time.monotonic() < deadline, f"transactions did not end: {states}"
                await asyncio.sleep(0.2)


def broker_events(broker: BrokerHandle, token: str, group: str) -> list[bytes]:
    """The bodies of this group's events, as the broker stored them."""
    with httpx.Client(base_url=broker.url) as http:
        end = http.get(f"/v1/topics/{EVENTS}").json()["offsets"][0]["max"]
    bodies: list[bytes] = []
    with TopicReader(broker.url, token, EVENTS) as client:
        for _, pulled in client.read_range(QueueRange(0, 0, end)):
            bodies.extend(b for b in pulled if f'"{group}"'.encode() in b)
    return bodies


def test_real_transactions_yield_exact_counts(spark: Any, events_broker: BrokerHandle,
                                              checker: ServiceProcess, token: str,
                                              job_dir: Path) -> None:
    group, topic = unique("shop"), events_broker.create_topic(unique("Orders"), queues=2)
    asyncio.run(run_transactions(events_broker, group, topic))
    bodies = broker_events(events_broker, token, group)
    assert httpx.get(f"{events_broker.url}/internal/v1/topics/{EVENTS}/queues/0/messages",
                     headers={TOKEN_HEADER: "wrong"}).status_code == 401

    _, got = run_once(spark, events_broker, token, EVENTS, job_dir, max_events=10_000)
    mine = {k: v for k, v in without_batch(got).items() if ("producer_group", group) in k[1]}
    want = {k: v for k, v in without_batch(expected(bodies)).items()
            if ("producer_group", group) in k[1]}
    assert mine == want

    g = {"producer_group": group, "topic": topic}
    assert sample(got, "tidemq_transaction_half_messages_total", **g) == len(PLAN)
    assert sample(got, "tidemq_transaction_commits_total", **g, source="producer") == 3
    assert sample(got, "tidemq_transaction_commits_total", **g, source="check") == 1
    assert sample(got, "tidemq_transaction_rollbacks_total", **g, source="producer") == 2
    assert sample(got, "tidemq_transaction_unknowns_total", **g, source="producer") == 2
    assert sample(got, "tidemq_transaction_discards_total", **g) == 1
    assert sample(got, "tidemq_transaction_checks_total", **g) >= 1 + CHECK_MAX
    assert sample(got, "tidemq_transaction_check_outcomes_total", **g, outcome="commit") == 1
    checks = "tidemq_transaction_resolution_checks_bucket"
    commit, discard = {**g, "outcome": "commit"}, {**g, "outcome": "discard"}
    assert sample(got, checks, **commit, le="0.0") == 3  # ended by the producer
    assert sample(got, checks, **commit, le="1.0") == 4  # one more after its first check
    assert sample(got, checks, **discard, le="2.0") == 0
    assert sample(got, checks, **discard, le="3.0") == 1
    resolution = "tidemq_transaction_resolution_seconds_count"
    assert sample(got, resolution, **commit) == 4
    assert sample(got, resolution, **{**g, "outcome": "rollback"}) == 2
    assert sample(got, "tidemq_transaction_resolution_seconds_bucket", **discard,
                  le="0.25") == 0  # at least CHECK_MAX checks 300 ms apart
