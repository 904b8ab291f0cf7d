"""Half messages as producer-made batches (``POST /v1/transactions`` with
``application/x-tidemq-batch``) on a real broker: stored invisible, committed and rolled back
like a JSON half, a retry answers the first ids, and bad reserved properties are refused with a
400 naming the record and the field while nothing of the request is stored."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from tidemq._batch import encode_halves
from tidemq.protocol import (
    CHECK_IMMUNITY_TIME_IN_SECONDS,
    PGROUP,
    REAL_QID,
    REAL_TOPIC,
    TRAN_MSG,
    TRANSACTION_ID,
    OutgoingMessage,
)
from tidemq.protocol.records.v2 import CONTENT_BATCH, BatchBuilder, DelayKind

from tests.support.transactions import BrokerHandle, Cluster, delivered, events, pending, unique
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"


def txid() -> str:
    return uuid.uuid4().hex


def post(b: BrokerHandle, group: str, topic: str, content: bytes) -> httpx.Response:
    return b.http.post("/v1/transactions", params={"producer_group": group, "topic": topic},
                       content=content, headers={"content-type": CONTENT_BATCH})


def end(b: BrokerHandle, group: str, tx: str, action: str) -> httpx.Response:
    return b.http.post(f"/v1/transactions/{tx}/end",
                       json={"producer_group": group, "action": action})


def messages(n: int, queue_id: int = 0, **fields: Any) -> list[OutgoingMessage]:
    return [OutgoingMessage(body=f"body-{i}".encode(), message_id=uuid.uuid4().hex,
                            queue_id=queue_id, **fields) for i in range(n)]


def test_half_batch_is_invisible_until_committed(cluster: Cluster) -> None:
    b = cluster.broker
    topic, group = b.create_topic(queues=2), unique("G")
    msgs = messages(3, queue_id=1, tag="red", keys=["k1"], properties={"app": "v"})
    ids = [txid() for _ in msgs]
    resp = post(b, group, topic, encode_halves(group, topic, 5, msgs, ids, 1_000))
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"stored": 3}  # each under the transaction id its record carries
    assert sorted(t["transaction_id"] for t in pending(b, group)) == sorted(ids)
    assert delivered(b, topic, 2) == []  # a half is never visible before its commit

    assert end(b, group, ids[0], "commit").json() == {"state": "committed"}
    assert end(b, group, ids[1], "rollback").json() == {"state": "rolled_back"}
    [got] = delivered(b, topic, 2)
    assert (got["message_id"], got["body"], got["queue_id"]) == \
        (msgs[0].message_id, "body-0", 1)
    assert got["tag"] == "red" and got["keys"] == ["k1"]  # the transaction id is not a key
    assert got["properties"] == {"app": "v"}  # no reserved property shows
    assert [t["transaction_id"] for t in pending(b, group)] == [ids[2]]
    kinds = {(e["event"], e["transaction_id"]) for e in events(b) if e["transaction_id"] in ids}
    assert kinds == {("half", t) for t in ids} | {("commit", ids[0]), ("rollback", ids[1])}


def test_a_retried_half_batch_answers_its_first_transaction_ids(cluster: Cluster) -> None:
    b = cluster.broker
    topic, group = b.create_topic(queues=1), unique("G")
    msgs = messages(2)
    first = [txid() for _ in msgs]
    content = encode_halves(group, topic, None, msgs, first, 1_000)
    assert post(b, group, topic, content).status_code == 200
    assert post(b, group, topic, content).json() == {"stored": 2}  # the same request again
    # a retry that made new ids (same message ids) still answers the first transactions
    again = post(b, group, topic, encode_halves(group, topic, None, msgs,
                                                [txid() for _ in msgs], 1_000))
    assert [t["transaction_id"] for t in again.json()["transactions"]] == first
    assert sorted(t["transaction_id"] for t in pending(b, group)) == sorted(first)
    # a transaction id in use, under a new message id: refused, nothing stored
    [fresh] = messages(1)
    refused = post(b, group, topic, encode_halves(group, topic, None, [fresh], [first[0]], 1))
    assert "records[0].properties.TRANSACTION_ID" in b.error(refused, 400, "BAD_REQUEST")
    assert len(pending(b, group)) == 2


def test_a_half_batch_is_checked_after_its_own_immunity(cluster: Cluster) -> None:
    """Born when stored (no BORN_MS in the batch): its re-put copies keep that birth, so a
    deferral never postpones its first check again."""
    b = cluster.broker
    topic, group = b.create_topic(queues=1), unique("G")
    tx = txid()
    assert post(b, group, topic, encode_halves(group, topic, 1, messages(1), [tx],
                                               1_000)).status_code == 200

    def checked() -> bool:
        cluster.checker.scan()
        return any(t["check_times"] >= 1 for t in pending(b, group))

    wait_until(checked, timeout=30, every=0.3, what="the first check of a batch half")
    [info] = pending(b, group)
    assert info["transaction_id"] == tx


def record(group: str, topic: str, tx: str, **change: Any) -> dict[str, Any]:
    """``BatchBuilder.add`` arguments of a valid half record, with ``change`` applied
    (``properties`` entries set to None are removed)."""
    props = {TRAN_MSG: "true", PGROUP: group, REAL_TOPIC: topic, REAL_QID: "0",
             TRANSACTION_ID: tx}
    for name, value in change.pop("properties", {}).items():
        if value is None:
            props.pop(name)
        else:
            props[name] = value
    return {"body": b"x", "message_id": uuid.uuid4().hex, "keys": [tx], "properties": props,
            **change}


def batch(records: list[dict[str, Any]], topic: str = HALF_TOPIC, queue_id: int = 0,
          sys_flag: int = 0) -> bytes:
    builder = BatchBuilder(topic, queue_id, sys_flag)
    for rec in records:
        builder.add(**rec)
    return builder.finish()


BAD_RECORDS: list[tuple[str, dict[str, Any]]] = [
    ("properties.PGROUP", {"properties": {PGROUP: "another-group"}}),
    ("properties.REAL_TOPIC", {"properties": {REAL_TOPIC: "another-topic"}}),
    ("properties.REAL_QID", {"properties": {REAL_QID: "7"}}),
    ("properties.TRAN_MSG", {"properties": {TRAN_MSG: None}}),
    ("properties.TRAN_MSG", {"properties": {TRAN_MSG: "false"}}),
    ("properties.TRANSACTION_ID", {"properties": {TRANSACTION_ID: "not/url-safe"}}),
    ("properties", {"properties": {"BORN_MS": "1"}}),  # a reserved name not allowed here
    ("properties", {"properties": {"DELAY": "3"}}),
    ("properties.CHECK_IMMUNITY_TIME_IN_SECONDS",
     {"properties": {CHECK_IMMUNITY_TIME_IN_SECONDS: "-1"}}),
    ("keys", {"keys": ["no-transaction-id"]}),
    ("delay_kind", {"delay_kind": DelayKind.DELAY_MS, "delay_value": 1000}),
]


@pytest.mark.parametrize(("field", "change"), BAD_RECORDS, ids=[f for f, _ in BAD_RECORDS])
def test_a_bad_half_record_is_named_and_nothing_is_stored(cluster: Cluster, field: str,
                                                          change: dict[str, Any]) -> None:
    b = cluster.broker
    topic, group = b.create_topic(queues=2), unique("G")
    good, bad = txid(), txid()
    content = batch([record(group, topic, good), record(group, topic, bad, **change)])
    message = b.error(post(b, group, topic, content), 400, "BAD_REQUEST")
    assert message.startswith(f"batches[0].records[1].{field}:"), message
    assert pending(b, group) == []  # the good record of the request was not stored either
    b.error(end(b, group, good, "commit"), 404, "TRANSACTION_NOT_FOUND")


@pytest.mark.parametrize(("field", "where"), [("topic", {"topic": "orders"}),
                                              ("queue_id", {"queue_id": 1}),
                                              ("sys_flag", {"sys_flag": 4})])
def test_a_bad_half_batch_header_is_named(cluster: Cluster, field: str,
                                          where: dict[str, Any]) -> None:
    b = cluster.broker
    topic, group = b.create_topic(queues=1), unique("G")
    content = batch([record(group, topic, txid())], **where)
    message = b.error(post(b, group, topic, content), 400, "BAD_REQUEST")
    assert message.startswith(f"batches[0].batch.{field}:"), message
    assert pending(b, group) == []


def test_a_batch_body_needs_its_group_and_topic(cluster: Cluster) -> None:
    b = cluster.broker
    topic, group = b.create_topic(queues=1), unique("G")
    content = batch([record(group, topic, txid())])
    resp = b.http.post("/v1/transactions", params={"topic": topic}, content=content,
                       headers={"content-type": CONTENT_BATCH})
    assert "producer_group" in b.error(resp, 400, "BAD_REQUEST")
    json_with_query = b.http.post("/v1/transactions", params={"topic": topic}, json={
        "producer_group": group, "topic": topic, "message": {"body": "x"}})
    assert "query" in b.error(json_with_query, 400, "BAD_REQUEST")
