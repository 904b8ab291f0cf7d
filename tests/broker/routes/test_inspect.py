"""The operators' endpoints on real processes (redis-server, broker, scheduler): one transaction
in any state, resolving a discarded one (commit or drop, with the state rules), a message's
trace (transaction checks, delay, retries) and pending timers by hour and by day."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.scheduler.harness import AUTH, DelayCluster, run_delay_cluster, unique
from tests.support.clock import now_ms
from tests.support.procs import RedisServer
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000
DAY_MS = 86_400_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory,
            redis_server: RedisServer) -> Iterator[DelayCluster]:
    with run_delay_cluster(tmp_path_factory.mktemp("inspect"), redis_server.url,
                           max_reconsume_times=0) as handle:
        yield handle


def half(c: DelayCluster, topic: str, group: str, **message: Any) -> tuple[str, str]:
    resp = c.http.post("/v1/transactions", json={
        "producer_group": group, "topic": topic, "message": {"body": "half", **message}})
    assert resp.status_code == 200, resp.text
    return str(resp.json()["transaction_id"]), str(resp.json()["message_id"])


def act(c: DelayCluster, txid: str, action: str) -> None:
    """What the checker does: check (one more half copy) or discard a pending transaction."""
    halves = c.http.get("/internal/v1/transactions/halves", params={"max": 4096}, headers=AUTH)
    [entry] = [e for e in halves.json()["entries"] if e["transaction_id"] == txid][-1:]
    resp = c.http.post("/internal/v1/transactions/actions", headers=AUTH, json={"actions": [
        {"transaction_id": txid, "physical_offset": entry["physical_offset"],
         "action": action}]})
    assert resp.status_code == 200, resp.text


def resolve(c: DelayCluster, txid: str, action: str) -> Any:
    return c.http.post(f"/v1/transactions/{txid}/resolve", json={"action": action})


def test_resolve_commit_delivers_a_discarded_transaction_once(cluster: DelayCluster) -> None:
    topic, group = cluster.broker.create_topic(queues=1), unique("PG")
    txid, mid = half(cluster, topic, group)
    act(cluster, txid, "check")
    act(cluster, txid, "discard")
    view = cluster.http.get(f"/v1/transactions/{txid}").json()
    assert view["state"] == "discarded" and view["check_times"] == 1
    assert view["resolution"] is None and view["producer_group"] == group
    assert cluster.broker.pull(topic, 0)["messages"] == []
    resp = resolve(cluster, txid, "commit")
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"transaction_id": txid, "message_id": mid, "state": "discarded",
                           "resolution": "committed"}
    assert resolve(cluster, txid, "commit").json()["resolution"] == "committed"  # same answer
    cluster.broker.error(resolve(cluster, txid, "drop"), 409, "TRANSACTION_ALREADY_ENDED")
    [msg] = cluster.broker.pull(topic, 0)["messages"]  # delivered exactly once
    assert msg["message_id"] == mid and msg["body"] == "half"
    assert cluster.state(mid) == "committed"
    assert cluster.http.get(f"/v1/transactions/{txid}").json()["resolution"] == "committed"


def test_resolve_drop_and_the_state_rules(cluster: DelayCluster) -> None:
    topic, group = cluster.broker.create_topic(queues=1), unique("PG")
    dropped, mid = half(cluster, topic, group)
    act(cluster, dropped, "discard")
    resp = cluster.http.post(f"/v1/transactions/{dropped}/resolve",
                             json={"action": "drop", "producer_group": group})
    assert resp.status_code == 200 and resp.json()["resolution"] == "dropped", resp.text
    cluster.broker.error(resolve(cluster, dropped, "commit"), 409, "TRANSACTION_ALREADY_ENDED")
    assert cluster.state(mid) == "discarded"
    assert cluster.broker.pull(topic, 0)["messages"] == []
    pending, _ = half(cluster, topic, group)
    assert "pending" in cluster.broker.error(resolve(cluster, pending, "commit"), 400,
                                             "BAD_REQUEST")
    resp = cluster.http.post(f"/v1/transactions/{pending}/end",
                             json={"producer_group": group, "action": "rollback"})
    assert resp.status_code == 200
    cluster.broker.error(resolve(cluster, pending, "commit"), 409, "TRANSACTION_ALREADY_ENDED")
    cluster.broker.error(resolve(cluster, "f" * 32, "commit"), 404, "TRANSACTION_NOT_FOUND")
    cluster.broker.error(cluster.http.get(f"/v1/transactions/{'e' * 32}"), 404,
                         "TRANSACTION_NOT_FOUND")
    cluster.broker.error(resolve(cluster, dropped, "publish"), 400, "BAD_REQUEST")
    cluster.broker.error(cluster.http.post(f"/v1/transactions/{dropped}/resolve",
                                           json={"action": "drop", "why": "x"}),
                         400, "BAD_REQUEST")
    cluster.broker.error(cluster.http.post(f"/v1/transactions/{dropped}/resolve", json={
        "action": "drop", "producer_group": "someone-else"}), 400, "BAD_REQUEST")


def test_trace_of_a_checked_committed_delayed_message(cluster: DelayCluster) -> None:
    topic, group = cluster.broker.create_topic(queues=1), unique("PG")
    txid, mid = half(cluster, topic, group, delay_ms=1000)
    act(cluster, txid, "check")
    act(cluster, txid, "check")
    resp = cluster.http.post(f"/v1/transactions/{txid}/end",
                             json={"producer_group": group, "action": "commit"})
    assert resp.status_code == 200, resp.text
    first = cluster.http.get(f"/v1/messages/{mid}/trace").json()
    assert first["transaction"]["check_times"] == 2
    assert first["transaction"]["state"] == "committed"
    assert [c["kind"] for c in first["copies"]][:3] == ["half", "half", "half"]
    assert first["copies"][2]["check_times"] == 2
    assert first["delay"]["deliver_at_ms"] > 0
    done = wait_until(lambda: (t := cluster.http.get(f"/v1/messages/{mid}/trace").json())
                      ["delay"]["state"] == "delivered" and t, 15, "the delivery")
    kinds = [c["kind"] for c in done["copies"]]
    assert kinds[-2:] == ["delayed", "delivered"], kinds
    assert done["consumable"] == {"topic": topic, "queue_id": 0, "queue_offset": 0}
    assert done["delay"]["delivered_ms"] >= done["delay"]["deliver_at_ms"] - 1000
    cluster.broker.error(cluster.http.get("/v1/messages/nope/trace"), 404, "MESSAGE_NOT_FOUND")


def test_trace_of_a_dead_letter(cluster: DelayCluster) -> None:
    topic, group = cluster.broker.create_topic(queues=1), unique("cg")
    mid = unique("m")
    cluster.broker.send(topic, {"message_id": mid, "body": "poison"})
    resp = cluster.http.post(f"/v1/groups/{group}/retry", json={"message_id": mid})
    assert resp.json()["destination"] == f"%DLQ%{group}"
    t = cluster.http.get(f"/v1/messages/{mid}/trace").json()
    assert [c["kind"] for c in t["copies"]] == ["stored", "dlq"]
    assert t["transaction"] is None and t["delay"] is None
    assert t["retries"][0]["group"] == group and t["retries"][0]["dead_lettered"]


def test_timers_histogram_by_hour_and_day(cluster: DelayCluster) -> None:
    topic = cluster.broker.create_topic(queues=1)
    now = now_ms()
    base = now - now % DAY_MS + 3 * DAY_MS  # three days ahead, at midnight UTC
    dues = [base + 5 * HOUR_MS + 60_000, base + 5 * HOUR_MS + 120_000,
            base + 7 * HOUR_MS, base + DAY_MS + HOUR_MS]
    cluster.broker.send(topic, *({"body": "t", "deliver_at_ms": d} for d in dues))
    wait_until(lambda: cluster.status()["pending_timers"] >= 4, 10, "timers taken in")

    def counts(by: str) -> dict[int, int]:
        resp = cluster.http.get("/v1/scheduled/histogram", params={"by": by})
        assert resp.status_code == 200, resp.text
        return {b["start_ms"]: b["count"] for b in resp.json()["buckets"]}

    hours = counts("hour")
    assert hours[base + 5 * HOUR_MS] == 2 and hours[base + 7 * HOUR_MS] == 1
    assert hours[base + DAY_MS + HOUR_MS] == 1
    days = counts("day")
    assert days[base] == 3 and days[base + DAY_MS] == 1
    cluster.broker.error(cluster.http.get("/v1/scheduled/histogram", params={"by": "week"}),
                         400, "BAD_REQUEST")


def test_a_resolution_survives_a_broker_restart(cluster: DelayCluster) -> None:
    """Last in the module: it restarts the broker."""
    topic, group = cluster.broker.create_topic(queues=1), unique("PG")
    committed, mid = half(cluster, topic, group)
    dropped, _ = half(cluster, topic, group)
    for txid in (committed, dropped):
        act(cluster, txid, "discard")
    assert resolve(cluster, committed, "commit").status_code == 200
    assert resolve(cluster, dropped, "drop").status_code == 200
    cluster.broker.restart()
    view = cluster.http.get(f"/v1/transactions/{committed}").json()
    assert view["state"] == "discarded" and view["resolution"] == "committed"
    assert resolve(cluster, committed, "commit").json()["resolution"] == "committed"
    cluster.broker.error(resolve(cluster, dropped, "commit"), 409, "TRANSACTION_ALREADY_ENDED")
    [msg] = cluster.broker.pull(topic, 0)["messages"]  # still delivered exactly once
    assert msg["message_id"] == mid
    assert cluster.state(mid) == "committed"
