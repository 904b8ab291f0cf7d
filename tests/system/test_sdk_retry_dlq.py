"""A message its handler keeps failing goes to ``%RETRY%<group>``, comes back with a growing
``reconsume_times`` and, past the broker's max reconsume times (2 here), lands in
``%DLQ%<group>``, readable through the REST pull API."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterator

import pytest
from tidemq import ConsumeResult, Producer, PushConsumer, ReceivedMessage

from tests.support.procs import RedisServer
from tests.support.wait import quiet_for_async, wait_until_async
from tests.system.sdk_harness import FAST_CONSUMER, SdkCluster, run_cluster, unique

pytestmark = pytest.mark.integration

MAX_RECONSUME = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory,
            redis_server: RedisServer) -> Iterator[SdkCluster]:
    # no scheduler and no back-off: a retried message comes back at once
    with run_cluster(tmp_path_factory.mktemp("retry"), redis_server.url,
                     max_reconsume_times=MAX_RECONSUME, retry_backoff=False) as handle:
        yield handle


async def test_retry_then_dlq(cluster: SdkCluster) -> None:
    topic = cluster.create_topic(queues=2)
    group = unique("G")
    attempts: dict[str, list[tuple[int, str]]] = defaultdict(list)
    good: list[str] = []

    async def handle(message: ReceivedMessage) -> ConsumeResult:
        if message.tag == "good":
            good.append(message.message_id)
            return ConsumeResult.SUCCESS
        attempts[message.message_id].append((message.reconsume_times, message.topic))
        if message.tag == "raises":
            raise RuntimeError("a handler bug counts as RETRY_LATER")
        return ConsumeResult.RETRY_LATER

    async with Producer(nameservers=cluster.nameservers) as producer:
        bad = [await producer.send(f"bad-{i}", topic=topic, tag="bad") for i in range(2)]
        bad.append(await producer.send("raises", topic=topic, tag="raises"))
        ok = await asyncio.gather(*(producer.send(f"ok-{i}", topic=topic, tag="good")
                                    for i in range(5)))
    bad_ids = {r.message_id for r in bad}
    dlq, retry = f"%DLQ%{group}", f"%RETRY%{group}"

    def dlq_count() -> int:
        route = cluster.route(dlq)
        return sum(cluster.max_offsets(dlq).values()) if route else 0

    async with PushConsumer(group, handler=handle, nameservers=cluster.nameservers,
                            subscriptions={topic: "*"}, **FAST_CONSUMER):
        await wait_until_async(lambda: dlq_count() == len(bad), 20, "every bad message in the DLQ")
        # a DLQ message must not be delivered again: no attempt more within half a second
        await quiet_for_async(lambda: sum(map(len, attempts.values())), 0.5, "attempts")
        await wait_until_async(
            lambda: cluster.committed(group, topic) == cluster.max_offsets(topic),
            5, "the group's offsets to pass the failed messages")

    assert set(attempts) == bad_ids
    for message_id, seen in attempts.items():
        # first delivery, then one per retry; the handler always sees the topic it subscribed
        assert seen == [(n, topic) for n in range(MAX_RECONSUME + 1)], (message_id, seen)
    assert sorted(good) == sorted(r.message_id for r in ok)
    assert sum(cluster.max_offsets(retry).values()) == len(bad) * MAX_RECONSUME

    dead = cluster.pull_all(dlq)  # REST pull in JSON
    assert {m["message_id"] for m in dead} == bad_ids
    for message in dead:
        assert message["topic"] == dlq
        assert message["reconsume_times"] == MAX_RECONSUME + 1
        assert message["body"] in {"bad-0", "bad-1", "raises"}
        assert message["tag"] in {"bad", "raises"}
