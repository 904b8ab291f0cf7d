"""Pure parts of the broker service layer: topics table, record conversion, tag filters, retry
destination, settings."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tidemq.protocol import ErrorCode, OutgoingMessage, Perm, ProtocolError, parse_perm

from tidemq_server.broker.consumers.retry import latest_copy, retry_delay_level
from tidemq_server.broker.messaging.convert import to_internal_wire, to_record, to_wire
from tidemq_server.broker.messaging.pull import TagFilter
from tidemq_server.broker.messaging.topics import TopicManager, validate_queues
from tidemq_server.broker.settings import BrokerSettings
from tidemq_server.broker.store.types import StoredRecord, tag_code


def stored(topic: str = "T", body: bytes = b"hi", reconsume: int = 0,
           props: dict[str, str] | None = None) -> StoredRecord:
    return StoredRecord(10, 100, topic, 2, 7, body, dict(props or {}), 0, 0, 111, "1.1.1.1:1",
                        222, "2.2.2.2:2", reconsume, 0)


async def test_topics_persist_atomically(tmp_path: Path) -> None:
    topics = TopicManager(tmp_path)
    seen = []
    topics.add_listener(lambda cfg: seen.append(cfg.name))
    cfg, changed = await topics.put("Orders", 8, Perm.READ_WRITE)
    assert changed and cfg.queues == 8
    assert (await topics.put("Orders", 8, Perm.READ_WRITE))[1] is False
    await topics.put("Orders", 4, Perm.READ)
    await topics.ensure_system("%RETRY%g", 1)
    assert seen == ["Orders", "Orders", "%RETRY%g"]
    data = json.loads((tmp_path / "topics.json").read_text())
    assert {t["name"] for t in data["topics"]} == {"Orders", "%RETRY%g"}
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    again = TopicManager(tmp_path)
    again.load()
    assert again.get("Orders") is not None and again.get("Orders").perm is Perm.READ  # type: ignore
    assert again.route_table() == {"Orders": {"queues": 4, "perm": "r"},
                                   "%RETRY%g": {"queues": 1, "perm": "rw"}}


async def test_topic_rules(tmp_path: Path) -> None:
    topics = TopicManager(tmp_path)
    for name, code in (("bad name", ErrorCode.INVALID_TOPIC_NAME),
                       ("%DLQ%g", ErrorCode.FORBIDDEN_SYSTEM_TOPIC),
                       ("SCHEDULE_TOPIC_XXXX", ErrorCode.FORBIDDEN_SYSTEM_TOPIC)):
        with pytest.raises(ProtocolError) as err:
            await topics.put(name, 1, Perm.READ_WRITE)
        assert err.value.code is code
    for bad in (0, 1025, True):
        with pytest.raises(ProtocolError):
            validate_queues(bad)
    with pytest.raises(ProtocolError):
        parse_perm("rwx")
    with pytest.raises(ProtocolError) as err:
        topics.require("Nope")
    assert err.value.code is ErrorCode.TOPIC_NOT_FOUND
    cfg, _ = await topics.ensure_system("SCHEDULE_TOPIC_XXXX")
    assert cfg.queues == 18


def test_record_round_trip_strips_reserved_properties() -> None:
    msg = OutgoingMessage(b"body", message_id="m", tag="A", keys=["k1", "k2"],
                          properties={"p": "v"}, sharding_key="s")
    rec = to_record(msg, "T", 2, "m", 5, "1.1.1.1:1")
    assert rec.tag_code == tag_code("A") and rec.properties["UNIQ_KEY"] == "m"
    back = stored(body=rec.body, props=rec.properties)
    wire = to_wire(back, binary=False)
    assert wire["message_id"] == "m" and wire["tag"] == "A" and wire["keys"] == ["k1", "k2"]
    assert wire["properties"] == {"p": "v"} and wire["body"] == "body"
    assert wire["born_timestamp_ms"] == 111 and wire["store_timestamp_ms"] == 222
    assert to_wire(stored(body=b"\xff"), binary=False)["body_encoding"] == "base64"
    assert to_wire(stored(body=b"\xff"), binary=True)["body"] == b"\xff"
    internal = to_internal_wire(back, binary=False)
    assert internal["properties"]["SHARDING_KEY"] == "s" and internal["physical_offset"] == 10


def test_tag_filter() -> None:
    assert TagFilter.parse("*").tags is None and TagFilter.parse("").codes is None
    with pytest.raises(ProtocolError, match="a tag is empty"):  # no empty tag (issue 25)
        TagFilter.parse("a || b ||")
    f = TagFilter.parse(" a ||b ")
    assert f.tags == {"a", "b"} and f.codes == {tag_code("a"), tag_code("b")}
    assert f.matches(stored(props={"TAGS": "a"}).tag)
    assert not f.matches(stored(props={"TAGS": "ab"}).tag) and not f.matches(stored().tag)
    assert TagFilter.parse(" a ||b ") == f and isinstance(TagFilter.parse("a"), TagFilter)


def test_retry_destination_parts() -> None:
    assert [retry_delay_level(n) for n in (1, 2, 3, 16, 30)] == [3, 4, 5, 18, 18]
    plain = stored("Orders")
    other = stored("%RETRY%other", reconsume=5)
    own = stored("%RETRY%g", reconsume=2)
    assert latest_copy([plain, own, other], "g") is own
    assert latest_copy([plain, other], "g") is plain


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEMQ_BROKER_NAMESERVERS", "http://a:1/, http://b:2")
    monkeypatch.setenv("TIDEMQ_BROKER_FLUSH", "sync")
    monkeypatch.setenv("TIDEMQ_BROKER_MAX_BODY_BYTES", "1000")
    s = BrokerSettings()
    assert s.port == 10911 and s.nameserver_urls == ["http://a:1", "http://b:2"]
    assert s.address == "http://127.0.0.1:10911" and s.store_config().flush == "sync"
    assert s.limits().max_body_bytes == 1000 and s.dedup_window_s == 600
    assert s.store_config().store_host == "127.0.0.1:10911"
