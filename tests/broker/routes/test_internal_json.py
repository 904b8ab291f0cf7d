"""Internal endpoints answer JSON as well as msgpack, and bad input with 400 in both.

JSON cannot carry bytes nor integer map keys: bytes travel as base64 text (the intake timer's
msgpack row, a due record's body) and queue-id keys become strings. A due record taken in JSON
goes back to ``deliver`` in JSON as it is.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

from tests.support.broker import TOKEN, BrokerHandle, msgpack_post, run_broker, unique
from tests.support.procs import RedisServer

pytestmark = pytest.mark.integration

AUTH = {"X-Tidemq-Token": TOKEN}
LEVELS = 18  # the default delay level table
FAR_FUTURE_MS = 4_000_000_000_000  # every waiting record is due by then


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory,
           redis_server: RedisServer) -> Iterator[BrokerHandle]:
    with run_broker(tmp_path_factory.mktemp("internal-json"), redis_server.url) as handle:
        yield handle


def _json(resp: Any) -> Any:
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    return resp.json()


def test_intake_in_json_carries_each_timer_row_as_base64(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=1)
    mid = unique("timer")
    broker.send(topic, {"message_id": mid, "body": "later", "delay_ms": 3_600_000})
    params = {"offset": 0, "max": 4096}
    answer = _json(broker.http.get("/internal/v1/schedule/intake", params=params, headers=AUTH))
    (timer,) = [t for t in answer["timers"] if t[2] == mid]
    offset, due, _, real_topic, row = timer
    assert real_topic == topic and due > 0 and isinstance(row, str)
    decoded = msgpack.unpackb(base64.b64decode(row), raw=False)
    assert decoded[0] == topic and decoded[2] == b"later"
    packed = broker.http.get("/internal/v1/schedule/intake", params=params,
                             headers={**AUTH, "accept": "application/msgpack"})
    assert packed.headers["content-type"] == "application/msgpack"
    timers = msgpack.unpackb(packed.content, raw=False)["timers"]
    (same,) = [t for t in timers if t[2] == mid]
    assert same[0] == offset and same[4] == base64.b64decode(row)


def test_levels_due_and_pending_in_json_and_deliver_takes_a_json_row_back(
        broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=1)
    mid = unique("level")
    broker.send(topic, {"message_id": mid, "body": "soon", "delay_level": 1})
    due = _json(broker.http.post("/internal/v1/schedule/levels/due", headers=AUTH,
                                 json={"offsets": {}, "now_ms": FAR_FUTURE_MS, "max": 4096}))
    assert set(due["levels"]) == {str(q) for q in range(LEVELS)}
    (record,) = [r for r in due["levels"]["0"]["records"] if r["message_id"] == mid]
    row = record["record"]
    assert row[0] == topic and base64.b64decode(row[2]) == b"soon"

    pending = _json(broker.http.post("/internal/v1/schedule/pending", headers=AUTH,
                                     json={"offsets": {"0": 0}, "topic": topic}))
    assert pending["by_queue"]["0"] == 1 and set(pending["by_queue"]) == set(due["levels"])

    body = {"records": [row], "strict": [0]}
    stored = _json(broker.http.post("/internal/v1/schedule/deliver", headers=AUTH, json=body))
    assert stored == {"stored": 1, "duplicates": 0}
    pulled = broker.pull(topic, 0)["messages"]
    assert [(m["message_id"], m["body"]) for m in pulled] == [(mid, "soon")]
    again = _json(broker.http.post("/internal/v1/schedule/deliver", headers=AUTH, json=body))
    assert again == {"stored": 0, "duplicates": 1}


def test_a_deliver_row_body_that_is_not_base64_is_400(broker: BrokerHandle) -> None:
    row = ["T", 0, "not base64!", {"UNIQ_KEY": unique("m")}, 0, 0, 0, "127.0.0.1:0", 0, 0]
    resp = broker.http.post("/internal/v1/schedule/deliver", headers=AUTH,
                            json={"records": [row]})
    broker.error(resp, 400, "BAD_REQUEST")


@pytest.mark.parametrize("action", [
    {"transaction_id": "tx", "physical_offset": 0, "action": {"check": 1}},
    {"transaction_id": {"tx": 1}, "physical_offset": 0, "action": "check"},
    {"transaction_id": "tx", "physical_offset": "0", "action": "check"},
    {"transaction_id": "tx", "physical_offset": 0, "action": ["check"]},
])
def test_malformed_checker_actions_are_400_in_json_and_msgpack(
        broker: BrokerHandle, action: dict[str, Any]) -> None:
    body = {"actions": [action]}
    broker.error(broker.http.post("/internal/v1/transactions/actions", headers=AUTH,
                                  json=body), 400, "BAD_REQUEST")
    broker.http.headers.update(AUTH)
    try:
        resp = msgpack_post(broker.http, "/internal/v1/transactions/actions", body)
    finally:
        del broker.http.headers["X-Tidemq-Token"]
    broker.error(resp, 400, "BAD_REQUEST")


@pytest.mark.parametrize(("path", "body"), [
    ("/internal/v1/schedule/levels/due", {"offsets": {"x": 1}, "now_ms": 0}),
    ("/internal/v1/schedule/pending", {"offsets": [], "intake_offset": 0}),
    ("/internal/v1/schedule/deliver", {"records": [], "strict": 3}),
    ("/internal/v1/schedule/deliver",
     {"records": [["T", 0, "", {"UNIQ_KEY": "m"}, 0, 0, 0, "127.0.0.1:0", 0, 0]], "strict": 3}),
    ("/internal/v1/schedule/progress", {"owner": "s", "positions": [["T", "q", 0]]}),
    ("/internal/v1/retention-floor", {"owner": "s", "physical_offset": -1}),
])
def test_malformed_schedule_requests_are_400(broker: BrokerHandle, path: str,
                                             body: dict[str, Any]) -> None:
    broker.error(broker.http.post(path, headers=AUTH, json=body), 400, "BAD_REQUEST")
