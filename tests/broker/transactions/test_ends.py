"""The REST contract of ends, on a real broker: duplicate and conflicting ends (single and batch
forms, concurrent), a check answer racing a late commit, errors, visibility while half."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import msgpack
import pytest

from tests.support.transactions import BrokerHandle, Cluster, delivered, pending, state_of, unique

pytestmark = pytest.mark.integration


def half(b: BrokerHandle, group: str, topic: str, **message: Any) -> dict[str, Any]:
    resp = b.http.post("/v1/transactions", json={"producer_group": group, "topic": topic,
                                                 "message": {"body": "x", **message}})
    assert resp.status_code == 200, resp.text
    answer: dict[str, Any] = resp.json()
    return answer


def end(b: BrokerHandle, group: str, txid: str, action: str, **extra: Any) -> httpx.Response:
    return b.http.post(f"/v1/transactions/{txid}/end",
                       json={"producer_group": group, "action": action, **extra})


def test_duplicate_and_conflicting_ends(cluster: Cluster) -> None:
    b = cluster.broker
    topic, group = b.create_topic(queues=1), unique("G")
    tx = half(b, group, topic, body="once")
    txid = tx["transaction_id"]
    assert end(b, group, txid, "unknown").json() == {"state": "half"}
    assert end(b, group, txid, "commit").json() == {"state": "committed"}
    assert end(b, group, txid, "commit", from_check=True).json() == {"state": "committed"}
    b.error(end(b, group, txid, "rollback"), 409, "TRANSACTION_ALREADY_ENDED")
    b.error(end(b, group, txid, "unknown"), 409, "TRANSACTION_ALREADY_ENDED")
    assert [m["body"] for m in delivered(b, topic, 1)] == ["once"]

    other = half(b, group, topic)["transaction_id"]
    assert end(b, group, other, "rollback").json() == {"state": "rolled_back"}
    assert end(b, group, other, "rollback").json() == {"state": "rolled_back"}
    b.error(end(b, group, other, "commit"), 409, "TRANSACTION_ALREADY_ENDED")
    assert len(delivered(b, topic, 1)) == 1

    b.error(end(b, group, "0123456789abcdef0123456789abcdef", "commit"), 404,
            "TRANSACTION_NOT_FOUND")
    b.error(end(b, group, txid, "maybe"), 400, "BAD_REQUEST")
    b.error(end(b, unique("G"), half(b, group, topic)["transaction_id"], "commit"), 400,
            "BAD_REQUEST")  # another group's transaction


def test_batch_end_answers_each_item(cluster: Cluster) -> None:
    b = cluster.broker
    topic, group = b.create_topic(queues=2), unique("G")
    resp = b.http.post("/v1/transactions", json={
        "producer_group": group, "topic": topic,
        "messages": [{"body": f"b{i}", "message_id": unique("mid")} for i in range(4)]})
    assert resp.status_code == 200, resp.text
    ids = [t["transaction_id"] for t in resp.json()["transactions"]]
    resp = b.http.post("/v1/transactions/end", json={"producer_group": group, "ends": [
        {"transaction_id": ids[0], "action": "commit"},
        {"transaction_id": ids[0], "action": "commit", "from_check": True},  # repeat in batch
        {"transaction_id": ids[1], "action": "rollback"},
        {"transaction_id": ids[1], "action": "commit"},  # conflict in the same batch
        {"transaction_id": ids[2], "action": "unknown"},
        {"transaction_id": "nope", "action": "commit"},
        {"transaction_id": ids[3], "action": "commit"},
    ]})
    assert resp.status_code == 200, resp.text
    results = resp.json()["results"]
    assert [r["transaction_id"] for r in results] == [ids[0], ids[0], ids[1], ids[1], ids[2],
                                                       "nope", ids[3]]
    assert [r.get("state") or r["code"] for r in results] == [
        "committed", "committed", "rolled_back", "TRANSACTION_ALREADY_ENDED", "half",
        "TRANSACTION_NOT_FOUND", "committed"]
    assert all(r["message"] for r in results if "code" in r)
    assert sorted(m["body"] for m in delivered(b, topic, 2)) == ["b0", "b3"]
    assert [p["transaction_id"] for p in pending(b, group)] == [ids[2]]


def test_racing_commits_and_check_answers_deliver_once(cluster: Cluster) -> None:
    b = cluster.broker
    topic, group = b.create_topic(queues=1), unique("G")
    ids = [half(b, group, topic, body=f"r{i}")["transaction_id"] for i in range(5)]

    def hit(args: tuple[str, int]) -> tuple[int, str]:
        txid, n = args
        with httpx.Client(base_url=b.url, timeout=30) as client:
            if n % 3 == 2:  # the batch form, as a checking producer answers
                resp = client.post("/v1/transactions/end", json={
                    "producer_group": group,
                    "ends": [{"transaction_id": txid, "action": "commit", "from_check": True}]})
                return resp.status_code, resp.json()["results"][0]["state"]
            resp = client.post(f"/v1/transactions/{txid}/end", json={
                "producer_group": group, "action": "commit", "from_check": n % 2 == 1})
            return resp.status_code, resp.json()["state"]

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(hit, [(t, n) for t in ids for n in range(8)]))
    assert set(answers) == {(200, "committed")}
    got = delivered(b, topic, 1)
    assert sorted(m["body"] for m in got) == [f"r{i}" for i in range(5)]
    assert len({m["message_id"] for m in got}) == 5


def test_half_is_invisible_but_queryable(cluster: Cluster) -> None:
    b = cluster.broker
    topic, group = b.create_topic(queues=2), unique("G")
    tx = half(b, group, topic, body="hidden", tag="TagA", keys=["order-1"],
              properties={"k": "v"}, queue_id=1)
    shown = b.http.get(f"/v1/messages/{tx['message_id']}").json()
    assert shown["state"] == "half" and shown["topic"] == topic and shown["queue_id"] == 1
    assert shown["keys"] == ["order-1"] and shown["properties"] == {"k": "v"}
    assert shown["tag"] == "TagA" and shown["body"] == "hidden"
    assert delivered(b, topic, 2) == []
    [listed] = pending(b, group)
    assert listed["transaction_id"] == tx["transaction_id"]
    assert listed["message_id"] == tx["message_id"] and listed["topic"] == topic
    assert listed["check_times"] >= 0 and listed["born_timestamp_ms"] > 0
    assert end(b, group, tx["transaction_id"], "commit").json() == {"state": "committed"}
    [got] = b.pull(topic, 1)["messages"]
    assert (got["tag"], got["keys"], got["properties"]) == ("TagA", ["order-1"], {"k": "v"})
    assert state_of(b, tx["message_id"]) == "committed"
    by_key = b.http.get("/v1/messages", params={"topic": topic, "key": "order-1"}).json()
    assert [m["message_id"] for m in by_key["messages"]] == [tx["message_id"]]


def test_half_requests_are_validated_and_idempotent(cluster: Cluster) -> None:
    b = cluster.broker
    topic, group = b.create_topic(queues=1), unique("G")
    mid = unique("same")
    first = half(b, group, topic, message_id=mid)
    again = half(b, group, topic, message_id=mid)  # a client retry: the same transaction
    assert again == first
    post = b.http.post
    b.error(post("/v1/transactions", json={"producer_group": group, "topic": "NoSuchTopic",
                                           "message": {"body": "x"}}), 404, "TOPIC_NOT_FOUND")
    b.error(post("/v1/transactions", json={"producer_group": group,
                                           "topic": "RMQ_SYS_TRANS_HALF_TOPIC",
                                           "message": {"body": "x"}}),
            403, "FORBIDDEN_SYSTEM_TOPIC")
    b.error(post("/v1/transactions", json={"producer_group": group, "topic": topic}), 400,
            "BAD_REQUEST")
    b.error(post("/v1/transactions", json={"topic": topic, "message": {"body": "x"}}), 400,
            "BAD_REQUEST")
    b.error(post("/v1/transactions", json={"producer_group": group, "topic": topic,
                                           "message": {"body": "x", "delay_level": 99}}),
            400, "INVALID_DELAY")
    # msgpack both ways, raw bytes bodies
    resp = post("/v1/transactions", content=msgpack.packb({
        "producer_group": group, "topic": topic,
        "messages": [{"body": b"\x00\xff"}, {"body": b"two"}]}, use_bin_type=True),
        headers={"content-type": "application/msgpack", "accept": "application/msgpack"})
    assert resp.status_code == 200, resp.text
    assert len(msgpack.unpackb(resp.content)["transactions"]) == 2


def test_a_delay_is_honoured_from_commit_or_refused(cluster: Cluster) -> None:
    """Never dropped silently: refused at half time while delays are off; once delays are on,
    the committed copy is not delivered at once."""
    b = cluster.broker
    topic, group = b.create_topic(queues=1), unique("G")
    resp = b.http.post("/v1/transactions", json={"producer_group": group, "topic": topic,
                                                 "message": {"body": "later",
                                                             "delay_ms": 60_000}})
    if resp.status_code == 400:
        assert resp.json()["code"] == "INVALID_DELAY"
        assert pending(b, group) == []
        return
    assert resp.status_code == 200, resp.text
    tx = resp.json()
    assert end(b, group, tx["transaction_id"], "commit").status_code == 200
    assert delivered(b, topic, 1) == []


def test_cli_tx_list(cluster: Cluster) -> None:
    from typer.testing import CliRunner

    from tidemq_server.cli import app

    b = cluster.broker
    topic, group = b.create_topic(queues=1), unique("G")
    tx = half(b, group, topic, body="cli")
    runner = CliRunner()
    result = runner.invoke(app, ["--broker", b.url, "tx", "list", "--group", group, "--json"])
    assert result.exit_code == 0, result.output
    assert '"' + tx["transaction_id"] + '"' in result.stdout
    result = runner.invoke(app, ["--broker", b.url, "tx", "list", "--group", group],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "1 pending transaction(s)" in result.stdout and tx["message_id"] in result.stdout
