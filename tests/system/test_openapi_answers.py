"""Real answers of every service match the schemas their OpenAPI documents declare.

Generated requests (test_openapi_schemathesis.py) rarely build a valid send or transaction, so
this walk drives each endpoint with real data — messages with text and binary bodies, delayed
ones, a simple consumer, a transaction with its half message — and validates every answer, in
JSON and in msgpack, against the document of the service that gave it.
"""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest
import schemathesis
from tidemq.protocol import CONTENT_JSON, CONTENT_MSGPACK

from tests.support import openapi
from tests.support.broker import TOKEN, unique
from tests.support.cluster import Cluster, all_services
from tidemq_server.common.constants import TOKEN_HEADER

pytestmark = pytest.mark.integration

__all__ = ["all_services", "openapi"]  # the fixture; msgpack for schemathesis

FAR_FUTURE_MS = 4_000_000_000_000  # every waiting record is due by then


class Service:
    """One service's HTTP client and document; ``call`` validates each answer against it."""

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=20.0, headers={TOKEN_HEADER: TOKEN})
        self.schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
        self.checked: set[str] = set()

    def call(self, method: str, template: str, path: str | None = None, *,
             json: Any = None, params: dict[str, Any] | None = None,
             both: bool = True) -> Any:
        """The JSON answer of ``method path``; with ``both`` the msgpack answer is fetched and
        validated too (for requests that may be repeated)."""
        operation = self.schema[template][method]
        answer: Any = None
        for accept in (CONTENT_JSON, CONTENT_MSGPACK) if both else (CONTENT_JSON,):
            resp = self.http.request(method, path or template, json=json, params=params,
                                     headers={"accept": accept})
            assert resp.status_code == 200, (method, path or template, resp.text)
            assert resp.headers["content-type"].startswith(accept)
            operation.validate_response(resp)
            if accept == CONTENT_JSON:
                answer = resp.json()
        self.checked.add(f"{method} {template}")
        return answer


def test_real_answers_match_the_documents(all_services: Cluster) -> None:
    broker = Service(all_services.broker.url)
    topic = unique("Doc")
    group = unique("G")
    broker.call("PUT", "/v1/topics/{topic}", f"/v1/topics/{topic}", json={"queues": 1})
    broker.call("GET", "/v1/topics")
    sent = broker.call("POST", "/v1/topics/{topic}/messages", f"/v1/topics/{topic}/messages",
                       both=False, json={"messages": [
                           {"body": "text", "tag": "t", "keys": ["k1"], "properties": {"a": "b"}},
                           {"body": base64.b64encode(b"\xff\x00").decode(),
                            "body_encoding": "base64"},
                           {"body": "level", "delay_level": 1},
                           {"body": "timer", "delay_ms": 3_600_000}]})["results"]
    text_id, _, level_id, timer_id = (r["message_id"] for r in sent)
    broker.call("GET", "/v1/topics/{topic}", f"/v1/topics/{topic}", params={"at_ms": 0})
    pulled = broker.call("GET", "/v1/topics/{topic}/queues/{queue_id}/messages",
                         f"/v1/topics/{topic}/queues/0/messages", params={"max": 10})
    assert {m["body_encoding"] for m in pulled["messages"]} == {"utf-8", "base64"}
    many = broker.call("POST", "/v1/pull", both=False, json={"queues": [
        {"topic": topic, "queue_id": 0, "offset": 0}, {"topic": topic, "queue_id": 3}]})
    assert [e.get("error", {}).get("code") for e in many["queues"]] == [None, "BAD_REQUEST"]
    broker.call("GET", "/v1/messages/{message_id}", f"/v1/messages/{text_id}")
    broker.call("GET", "/v1/messages/{message_id}", f"/v1/messages/{timer_id}")
    broker.call("GET", "/v1/messages", params={"topic": topic, "key": "k1"})
    broker.call("GET", "/v1/messages", params={"topic": topic, "begin_ms": 0,
                                               "end_ms": FAR_FUTURE_MS})

    # consumers: a group, its offsets, a simple consumer, a retry
    broker.call("POST", "/v1/groups/{group}/heartbeat", f"/v1/groups/{group}/heartbeat",
                json={"client_id": "c1", "subscriptions": {topic: "*"}})
    broker.call("PUT", "/v1/groups/{group}/offsets", f"/v1/groups/{group}/offsets",
                json={"offsets": [{"topic": topic, "queue_id": 0, "offset": 1}]})
    broker.call("GET", "/v1/groups/{group}/offsets", f"/v1/groups/{group}/offsets")
    broker.call("GET", "/v1/groups")
    received = broker.call("POST", "/v1/groups/{group}/receive", f"/v1/groups/{group}/receive",
                           both=False, json={"topic": topic, "max": 2, "wait_ms": 0})
    handles = [m["receipt_handle"] for m in received["messages"]]
    assert handles
    moved = broker.call("POST", "/v1/groups/{group}/invisibility",
                        f"/v1/groups/{group}/invisibility", both=False,
                        json={"receipt_handle": handles[0], "invisible_ms": 60_000})
    broker.call("POST", "/v1/groups/{group}/ack", f"/v1/groups/{group}/ack", both=False,
                json={"receipt_handles": [moved["receipt_handle"], *handles[1:]]})
    broker.call("POST", "/v1/groups/{group}/retry", f"/v1/groups/{group}/retry", both=False,
                json={"message_id": text_id})
    broker.call("DELETE", "/v1/groups/{group}/members/{client_id}",
                f"/v1/groups/{group}/members/c1")

    # delays, as clients and as the scheduler see them
    broker.call("GET", "/v1/scheduled", params={"topic": topic})
    broker.call("GET", "/v1/scheduled/histogram", params={"by": "day"})
    broker.call("GET", "/v1/messages/{message_id}/trace", f"/v1/messages/{timer_id}/trace")
    broker.call("GET", "/internal/v1/schedule/info")
    broker.call("GET", "/internal/v1/schedule/intake", params={"offset": 0, "max": 4096})
    due = broker.call("POST", "/internal/v1/schedule/levels/due",
                      json={"offsets": {}, "now_ms": FAR_FUTURE_MS, "max": 4096})
    rows = [r["record"] for r in due["levels"]["0"]["records"] if r["message_id"] == level_id]
    broker.call("POST", "/internal/v1/schedule/pending", json={"offsets": {}, "topic": topic})
    broker.call("POST", "/internal/v1/schedule/deliver",
                json={"records": rows, "strict": [0]})
    broker.call("POST", "/internal/v1/schedule/progress",
                json={"owner": unique("owner"), "positions": [[topic, 0, 0]]})
    broker.call("DELETE", "/v1/messages/{message_id}/schedule",
                f"/v1/messages/{timer_id}/schedule")
    cancels = broker.call("GET", "/internal/v1/schedule/cancels", params={"max": 4096})
    assert timer_id in cancels["message_ids"]

    # a transaction: half message, checks, the checker's view, the end
    producers = unique("P")
    half = broker.call("POST", "/v1/transactions", both=False, json={
        "producer_group": producers, "topic": topic, "message": {"body": "half"}})
    broker.call("POST", "/v1/producers/{group}/heartbeat", f"/v1/producers/{producers}/heartbeat",
                json={"client_id": "p1"})
    broker.call("GET", "/v1/producers/{group}/checks", f"/v1/producers/{producers}/checks",
                params={"client_id": "p1", "wait_ms": 0})
    broker.call("GET", "/v1/transactions", params={"producer_group": producers})
    broker.call("GET", "/internal/v1/transactions/info")
    halves = broker.call("GET", "/internal/v1/transactions/halves", params={"max": 1024})
    (entry,) = [e for e in halves["entries"] if e["transaction_id"] == half["transaction_id"]]
    broker.call("POST", "/internal/v1/transactions/actions", both=False, json={"actions": [
        {"transaction_id": entry["transaction_id"], "physical_offset": entry["physical_offset"],
         "action": "defer"}]})
    broker.call("POST", "/v1/transactions/{transaction_id}/end",
                f"/v1/transactions/{half['transaction_id']}/end",
                json={"producer_group": producers, "action": "commit"})
    broker.call("POST", "/v1/transactions/end", json={"producer_group": producers, "ends": [
        {"transaction_id": half["transaction_id"], "action": "commit"}]})
    broker.call("GET", "/internal/v1/transactions/ops", params={"max": 1024})
    # a discarded transaction, seen and resolved by an operator
    dropped = broker.call("POST", "/v1/transactions", both=False, json={
        "producer_group": producers, "topic": topic, "message": {"body": "dropped"}})
    halves = broker.call("GET", "/internal/v1/transactions/halves", params={"max": 1024})
    (entry,) = [e for e in halves["entries"] if e["transaction_id"] == dropped["transaction_id"]]
    broker.call("POST", "/internal/v1/transactions/actions", both=False, json={"actions": [
        {"transaction_id": entry["transaction_id"], "physical_offset": entry["physical_offset"],
         "action": "discard"}]})
    broker.call("GET", "/v1/transactions/{transaction_id}",
                f"/v1/transactions/{dropped['transaction_id']}")
    broker.call("POST", "/v1/transactions/{transaction_id}/resolve",
                f"/v1/transactions/{dropped['transaction_id']}/resolve",
                json={"action": "drop"})
    broker.call("GET", "/v1/messages/{message_id}/trace",
                f"/v1/messages/{dropped['message_id']}/trace")
    broker.call("DELETE", "/v1/producers/{group}/members/{client_id}",
                f"/v1/producers/{producers}/members/p1")

    # raw records, as the checker, scheduler and sidecar read them
    put = broker.call("POST", "/internal/v1/topics/{topic}/messages",
                      f"/internal/v1/topics/{topic}/messages", both=False,
                      json={"records": [{"body": "raw", "properties": {"K": "V"}}]})
    raw = broker.call("GET", "/internal/v1/topics/{topic}/queues/{queue_id}/messages",
                      f"/internal/v1/topics/{topic}/queues/0/messages")
    offset = raw["messages"][-1]["physical_offset"]
    assert raw["messages"][-1]["message_id"] == put["results"][0]["message_id"]
    broker.call("GET", "/internal/v1/records/{physical_offset}",
                f"/internal/v1/records/{offset}")
    broker.call("GET", "/internal/v1/topics/{topic}/queues/{queue_id}/bodies",
                f"/internal/v1/topics/{topic}/queues/0/bodies")
    broker.call("POST", "/internal/v1/retention-floor",
                json={"owner": unique("owner"), "physical_offset": 0})
    # replication endpoints answer on a broker without replication too (a primary at epoch 0)
    broker.call("GET", "/internal/v1/replication/fetch", params={"from": 0, "broker_id": 1})
    broker.call("GET", "/internal/v1/replication/log", params={"from": 0})
    broker.call("GET", "/internal/v1/replication/epochs")
    broker.call("GET", "/internal/v1/replication/metadata")
    broker.call("GET", "/internal/v1/replication/status")
    broker.call("POST", "/internal/v1/replication/role", json={"role": "primary", "epoch": 0})
    # a restart naming another process stops nothing: its refusal is the answer checked here
    # (a real restart: tests/broker/replication/test_failover_windows.py)
    refused = broker.http.post("/internal/v1/replication/restart", json={"pid": 1})
    assert refused.status_code == 400, refused.text
    broker.schema["/internal/v1/replication/restart"]["POST"].validate_response(refused)
    broker.checked.add("POST /internal/v1/replication/restart")
    broker.call("DELETE", "/v1/topics/{topic}", f"/v1/topics/{topic}", both=False)
    for ops in ("/healthz", "/metrics"):
        resp = broker.http.get(ops)
        assert resp.status_code == 200
        broker.schema[ops]["GET"].validate_response(resp)

    every = {f"{m.upper()} {p}" for p, item in broker.schema.raw_schema["paths"].items()
             for m in item}
    assert every - broker.checked == {"GET /healthz", "GET /metrics"}

    nameserver = Service(all_services.nameserver.url)
    nameserver.call("GET", "/v1/cluster")
    seeded = all_services.broker.http.get("/v1/topics").json()["topics"][0]["name"]
    nameserver.call("GET", "/v1/routes/{topic}", f"/v1/routes/{seeded}")

    scheduler = Service(all_services.scheduler.url)
    scheduler.call("GET", "/internal/v1/status")
    scheduler.call("GET", "/internal/v1/scheduled")
    scheduler.call("GET", "/internal/v1/scheduled/histogram", params={"by": "hour"})
    scheduler.call("POST", "/internal/v1/clock", json={"advance_ms": 0})

    checker = Service(all_services.checker.url)
    checker.call("POST", "/internal/v1/scan")

    sidecar = Service(all_services.sidecar.url)
    sidecar.call("GET", "/v1/status")
