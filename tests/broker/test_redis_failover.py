"""Redis failover under Sentinel while consumers commit: a broker whose Redis URL names a
Sentinel-managed Redis (master, one replica, three sentinels) keeps answering offset commits
through a SIGKILL of the Redis master, and every commit it acknowledged is readable afterwards.

Why no acknowledged commit can be lost: with a replica connected, the broker answers a commit only
after ``WAIT 1`` confirmed the replica holds it; Sentinel promotes that replica (the only one,
and in general the one with the largest replication offset). Why (almost) no errors: a commit
caught by the failover is retried against whichever master the sentinels name, for up to
``failover_wait_s`` (10 s by default), while the failover takes down-after-milliseconds (1 s
here) plus an election (~1-2 s). The bound asserted is one failed request per committer — the
one in flight at the switch, should the failover outlast the wait on a loaded machine.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.support.broker import BrokerHandle, run_broker, unique
from tests.support.sentinel import SentinelGroup
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration

QUEUES = 4
COMMITTERS = 4  # consumer groups committing at once, one thread each
PER_QUEUE = 3000  # messages per queue: the highest offset a committer may reach


@dataclass
class Committer:
    """One consumer group committing the same growing offset for every queue, back to back."""

    url: str
    topic: str
    group: str = field(default_factory=lambda: unique("G"))
    acked: list[tuple[float, int]] = field(default_factory=list)  # (time, offset) answered 200
    errors: list[tuple[float, int, str]] = field(default_factory=list)  # (time, status, body)
    attempted: int = 0
    slowest_s: float = 0.0

    def run(self, stop: threading.Event) -> None:
        with httpx.Client(base_url=self.url, timeout=30.0) as http:
            for offset in range(1, PER_QUEUE + 1):
                if stop.is_set():
                    return
                self.attempted = offset
                body = {"offsets": [{"topic": self.topic, "queue_id": q, "offset": offset}
                                    for q in range(QUEUES)]}
                started = time.monotonic()
                try:
                    resp = http.put(f"/v1/groups/{self.group}/offsets", json=body)
                    status, text = resp.status_code, resp.text
                except httpx.HTTPError as exc:
                    status, text = 0, repr(exc)
                now = time.monotonic()
                self.slowest_s = max(self.slowest_s, now - started)
                if status == 200:
                    self.acked.append((now, offset))
                else:
                    self.errors.append((now, status, text))
                time.sleep(0.002)


@pytest.fixture
def redis_ha(tmp_path: Path) -> Iterator[SentinelGroup]:
    group = SentinelGroup(tmp_path / "redis-ha").start()
    yield group
    group.stop()


@pytest.fixture
def broker(tmp_path: Path, redis_ha: SentinelGroup) -> Iterator[BrokerHandle]:
    with run_broker(tmp_path, redis_ha.url) as handle:
        yield handle


def test_commits_survive_a_redis_failover(redis_ha: SentinelGroup,
                                          broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=QUEUES)
    for q in range(QUEUES):
        for _ in range(0, PER_QUEUE, 1000):
            broker.send(topic, *({"body": "x", "queue_id": q} for _ in range(1000)))
    committers = [Committer(broker.url, topic) for _ in range(COMMITTERS)]
    stop = threading.Event()
    threads = [threading.Thread(target=c.run, args=(stop,), daemon=True) for c in committers]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: all(c.acked for c in committers), what="a commit of each committer")
        killed_at = time.monotonic()
        old = redis_ha.kill_master()
        new = redis_ha.wait_failover(old)
        failed_over_at = time.monotonic()
        # commits go on against the new master
        wait_until(lambda: all(c.acked[-1][0] > failed_over_at for c in committers),
                   what="a commit of each committer answered after the failover")
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert new != old
    errors = [e for c in committers for e in c.errors]
    assert len(errors) <= COMMITTERS, errors
    for c in committers:
        assert c.acked[-1][0] > failed_over_at, f"{c.group}: no commit answered after failover"
        # every acknowledged commit is still there: the last one (offsets only grow) or later
        got = broker.http.get(f"/v1/groups/{c.group}/offsets", params={"topic": topic})
        assert got.status_code == 200, got.text
        offsets = {o["queue_id"]: o["offset"] for o in got.json()["offsets"]}
        last_acked = c.acked[-1][1]
        assert set(offsets) == set(range(QUEUES))
        assert all(last_acked <= v <= c.attempted for v in offsets.values()), (
            c.group, offsets, last_acked, c.attempted)
    with redis_ha.data[new].client() as direct:  # and they are on the new master itself
        assert direct.execute_command("ROLE")[0] == "master"
    print(f"\nfailover {failed_over_at - killed_at:.2f}s; commits answered: "
          f"{sum(len(c.acked) for c in committers)}; errors: {len(errors)}; slowest commit "
          f"{max(c.slowest_s for c in committers):.2f}s")
