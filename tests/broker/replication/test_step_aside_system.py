"""A primary cut off from its replicas while etcd sees everyone (the faults suite's "bridge")
steps aside, on real processes: a 3-copy group elected by a real etcd whose members reach each
other through relays (tests/support/relay.py). Cutting the primary's relay stops every fetch of
its replicas (the primary's internal address is the relay's) while every member keeps renewing
its lease in etcd and the test still reaches every broker directly: exactly "replicas alive in
etcd but not fetching". SIGSTOP would not do (it also stops their etcd renewals: they would look
dead, and a primary must not step aside for dead replicas), and network namespaces need root.

Asserted: a replica becomes primary within a few seconds, sends succeed on it; the old primary
acknowledged nothing while cut off, and after the heal it follows the new primary with the same
log, which holds every acknowledged message and none of the refused ones.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.broker.replication.test_failover_system import QUEUES, TOPIC, stored_ids
from tests.support.procs import RedisServer
from tests.support.replicated import ReplicatedGroup, run_replicated_group
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration

LAG_MAX_MS = 1500  # replicas silent this long are out of sync (bench.faults uses the same)
# The longest wait for a replica to take over once the primary is cut off (s). Without the
# rule none ever does while the cut lasts (the old primary keeps its lease); expected about
# the fetch wait + replica_silence_ms + step_aside_after_s + an election (~2 s): a generous
# bound for a loaded machine.
TAKEOVER_WAIT_S = 20.0


@pytest.fixture
def group(tmp_path: Path, redis_server: RedisServer) -> Iterator[ReplicatedGroup]:
    with run_replicated_group(tmp_path, redis_server.url, copies=3, relayed=True,
                              replica_lag_max_ms=LAG_MAX_MS, sync_ack_timeout_ms=2000) as g:
        g.create_topic(TOPIC, QUEUES)
        yield g


def _send(g: ReplicatedGroup, broker_id: int, message_id: str) -> httpx.Response:
    return g.http.post(f"{g.brokers[broker_id].url}/v1/topics/{TOPIC}/messages", timeout=10,
                       json={"messages": [{"body": message_id, "message_id": message_id}]})


def _in_sync(g: ReplicatedGroup, broker_id: int, copies: int = 3) -> bool:
    """``broker_id`` leads with at least ``copies`` copies in sync."""
    st = g.status(broker_id)
    return bool(st) and st["role"] == "primary" and st["in_sync_copies"] >= copies  # type: ignore[index]


def _newer_primary(g: ReplicatedGroup, epoch: int) -> tuple[int, int] | None:
    """(broker_id, epoch) of a member leading under an epoch past ``epoch``."""
    for broker_id in range(g.copies):
        st = g.status(broker_id)
        if st and st["role"] == "primary" and not st["deposed"] and st["epoch"] > epoch:
            return broker_id, int(st["epoch"])
    return None


class Sender:
    """Sends to one broker from a thread until stopped: what it acknowledged, what it refused."""

    def __init__(self, g: ReplicatedGroup, broker_id: int, prefix: str) -> None:
        self.g, self.broker_id, self.prefix = g, broker_id, prefix
        self.acked: list[str] = []
        self.refused: dict[str, str] = {}  # message id → error code
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            mid = f"{self.prefix}-{i}"
            i += 1
            try:
                resp = _send(self.g, self.broker_id, mid)
            except httpx.HTTPError as exc:
                self.refused[mid] = type(exc).__name__
                continue
            if resp.status_code == 200:
                self.acked.append(mid)
            else:
                self.refused[mid] = resp.json().get("code", str(resp.status_code))
            time.sleep(0.02)

    def __enter__(self) -> Sender:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


def test_a_primary_cut_off_from_live_replicas_steps_aside_and_rejoins(
        group: ReplicatedGroup) -> None:
    g = group
    old, epoch = g.wait_primary()
    wait_until(lambda: _in_sync(g, old), 20, "three copies in sync")
    before = [f"before-{i}" for i in range(20)]
    for mid in before:
        resp = _send(g, old, mid)
        assert resp.status_code == 200, resp.text
    wait_until(lambda: _in_sync(g, old), 20, "three copies in sync, every record copied")

    g.relays[old].cut()
    cut_at = time.monotonic()
    with Sender(g, old, "cut") as to_old:
        found = wait_until(lambda: _newer_primary(g, epoch), TAKEOVER_WAIT_S,
                           "a replica elected while the primary is cut off")
        assert found is not None
        new, new_epoch = found
        took = time.monotonic() - cut_at
        wait_until(lambda: len(to_old.refused) > 0, 20, "a send to the old primary answered")
    print(f"a replica took over {took:.2f} s after the cut")
    assert new != old and new_epoch > epoch
    assert to_old.acked == []  # cut off, the old primary acknowledged nothing
    assert set(to_old.refused.values()) <= {"NOT_ENOUGH_REPLICAS", "NOT_PRIMARY"}, to_old.refused
    # the new primary acknowledges once a replica caught up with it (the other replica, or
    # the old primary following it), as after any election
    wait_until(lambda: _in_sync(g, new, 2), 20, "a replica in sync with the new primary")
    after = [f"after-{i}" for i in range(20)]
    for mid in after:
        resp = _send(g, new, mid)
        assert resp.status_code == 200, resp.text
    assert "stepping aside as primary" in g.brokers[old].logs()

    g.relays[old].heal()

    def rejoined() -> bool:
        st = g.status(old)
        return bool(st) and st["role"] == "replica" and st["epoch"] == new_epoch  # type: ignore[index]

    wait_until(rejoined, 20, "the old primary following the new one")
    wait_until(lambda: _in_sync(g, new), 20, "the old primary in sync again")
    stored = stored_ids(g, new)
    assert set(before) | set(after) <= set(stored)  # nothing acknowledged is lost
    assert not set(to_old.refused) & set(stored)  # its unacknowledged tail is gone
    wait_until(lambda: stored_ids(g, old) == stored, 20, "the old primary holding the same log")
