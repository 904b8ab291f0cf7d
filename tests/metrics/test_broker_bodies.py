"""The broker's bulk internal pull (bodies and queue offsets only) the data source uses."""

from __future__ import annotations

import base64

import msgpack
import pytest

from tests.support.broker import BrokerHandle, unique
from tests.support.metrics import put_events
from tidemq_server.common.constants import TOKEN_HEADER

pytestmark = pytest.mark.integration


def test_bodies_in_msgpack_and_json(events_broker: BrokerHandle, token: str) -> None:
    topic = events_broker.create_topic(unique("Bodies"), queues=2)
    bodies = [b"\xff\x00raw", b'{"event": "half"}', b"third", b"fourth"]
    put_events(events_broker.url, token, topic, bodies, queues=2)  # 0, 2 → q0; 1, 3 → q1
    path = f"/internal/v1/topics/{topic}/queues/0/bodies"
    raw = events_broker.http.get(path, params={"offset": 0, "max": 10}, headers={
        TOKEN_HEADER: token, "accept": "application/msgpack"})
    assert raw.status_code == 200, raw.text
    answer = msgpack.unpackb(raw.content, raw=False)
    assert answer["offsets"] == [0, 1] and answer["bodies"] == [bodies[0], bodies[2]]
    assert (answer["next_offset"], answer["min_offset"], answer["max_offset"]) == (2, 0, 2)
    text = events_broker.http.get(path, params={"offset": 1}, headers={TOKEN_HEADER: token})
    body = text.json()
    assert body["body_encoding"] == "base64" and body["offsets"] == [1]
    assert [base64.b64decode(b) for b in body["bodies"]] == [bodies[2]]
    missing = events_broker.http.get(path, params={"offset": 0})
    assert missing.status_code == 401 and missing.json()["code"] == "UNAUTHORIZED"
    system = events_broker.http.get(f"/internal/v1/topics/{unique('TIDE_SYS_X')}/queues/0/"
                                    "bodies", headers={TOKEN_HEADER: token})
    assert system.status_code == 200 and system.json()["offsets"] == []
