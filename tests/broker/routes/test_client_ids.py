"""A client's strings cannot forge the logs (real broker process).

``client_id`` with control characters is refused with 400 on every endpoint that takes one
(consumer and producer heartbeats, leaving, the check poll) and never listed; a string the
broker accepts and logs (a message id with a newline) is written escaped, on one line.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.support.broker import BrokerHandle, run_broker, unique
from tests.support.procs import RedisServer
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration

BAD_IDS = ["a\nb\u0000", "tab\tinside", "esc\x1b[31m", "del\x7f", "line\u2028sep"]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory,
           redis_server: RedisServer) -> Iterator[BrokerHandle]:
    with run_broker(tmp_path_factory.mktemp("client-ids"), redis_server.url,
                    max_reconsume_times=0) as b:
        yield b


@pytest.mark.parametrize("client_id", BAD_IDS)
def test_a_client_id_with_control_characters_is_refused(broker: BrokerHandle,
                                                        client_id: str) -> None:
    topic = broker.create_topic()
    group = unique("g")
    resp = broker.http.post(f"/v1/groups/{group}/heartbeat", json={
        "client_id": client_id, "subscriptions": {topic: "*"}})
    assert "client_id" in broker.error(resp, 400, "BAD_REQUEST")
    resp = broker.http.post(f"/v1/producers/{group}/heartbeat", json={"client_id": client_id})
    assert "client_id" in broker.error(resp, 400, "BAD_REQUEST")
    resp = broker.http.get(f"/v1/producers/{group}/checks",
                           params={"client_id": client_id, "wait_ms": 0})
    assert "client_id" in broker.error(resp, 400, "BAD_REQUEST")
    for kind in ("groups", "producers"):
        resp = broker.http.delete(f"/v1/{kind}/{group}/members/{quote(client_id, safe='')}")
        assert "client_id" in broker.error(resp, 400, "BAD_REQUEST")
    listed = broker.http.get("/v1/groups").json()["groups"]
    assert group not in [g["group"] for g in listed]


def test_a_plain_client_id_still_joins(broker: BrokerHandle) -> None:
    topic, group = broker.create_topic(), unique("g")
    resp = broker.http.post(f"/v1/groups/{group}/heartbeat", json={
        "client_id": "host-1@42 (worker ünïcode)", "subscriptions": {topic: "*"}})
    assert resp.status_code == 200 and resp.json()["members"] == ["host-1@42 (worker ünïcode)"]


def test_a_logged_client_string_stays_on_one_line(broker: BrokerHandle) -> None:
    topic, group = broker.create_topic(queues=1), unique("g")
    forged = "2026-01-01 00:00:00,000 ERROR broker: FORGED"
    message_id = f"m-{unique('x')}\n{forged}\x1b[2J"
    broker.send(topic, {"message_id": message_id, "body": "x"})
    resp = broker.http.post(f"/v1/groups/{group}/retry", json={"message_id": message_id})
    assert resp.status_code == 200 and resp.json()["destination"] == f"%DLQ%{group}"
    log_path = Path(broker.proc.log_path)
    line = wait_until(lambda: next((ln for ln in log_path.read_bytes().splitlines()
                                  if group.encode() in ln and b"moved to" in ln), None),
                    10, "the DLQ move logged")
    assert b"\\n" + forged.encode() + b"\\x1b[2J" in line
    assert not any(ln.startswith(forged.encode()) for ln in log_path.read_bytes().splitlines())
    assert b"\x1b" not in log_path.read_bytes()
