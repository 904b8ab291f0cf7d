"""What the checker, scheduler and metrics sidecar may do through ``/internal/``.

Write records as they are (system topics included, explicit sys_flag and raw properties), read
them back with raw properties and physical offsets, and hold retention back to their progress.
The request shapes live here, in one place for every internal caller.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from tidemq.protocol import (
    TAGS,
    UNIQ_KEY,
    ErrorCode,
    ProtocolError,
    is_system_topic,
    validate_topic_name,
)
from tidemq.protocol.message import reject_unknown
from tidemq.protocol.numbers import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, integer

from tidemq_server.broker.ingest.writes import Ingest
from tidemq_server.broker.messaging.convert import new_message_id
from tidemq_server.broker.messaging.topics import TopicConfig, TopicManager
from tidemq_server.broker.store.store import MessageStore
from tidemq_server.broker.store.types import MessageRecord, StoredRecord, tag_code
from tidemq_server.common.clock import now_ms

MAX_RECORDS = 4096  # records per internal write
MAX_PORT = 65_535  # the port of a born_host
DEFAULT_BORN_HOST = "127.0.0.1:0"
#: The fields of a record written as it is, and of the request; any other is refused.
RECORD_FIELDS = frozenset({
    "topic", "queue_id", "body", "body_encoding", "properties", "tag_code", "flag", "sys_flag",
    "born_timestamp_ms", "born_host", "reconsume_times", "prepared_tx_offset",
})
PUT_FIELDS = frozenset({"records", "dedup"})


def records_of(payload: Any, fields: frozenset[str], what: str, verb: str, most: int
               ) -> list[Any]:
    """The ``records`` of an internal request body ``{records: [...], ...}`` (not yet parsed).

    400 BAD_REQUEST when the body is not that object, has a field outside ``fields`` (``what``
    names the request in the message) or lists not 1-``most`` records (``verb`` says what the
    request does with them).
    """
    if not isinstance(payload, dict) or not isinstance(payload.get("records"), list):
        raise ProtocolError(ErrorCode.BAD_REQUEST, 'the body must be {"records": [...]}')
    reject_unknown(payload, fields, what)
    items: list[Any] = payload["records"]
    if not 1 <= len(items) <= most:
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"{verb} 1-{most} records")
    return items


def _field(obj: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    value = obj.get(name, default)
    if not isinstance(value, kind):
        raise ProtocolError(ErrorCode.BAD_REQUEST,
                            f"{name} must be {kind.__name__}, got {type(value).__name__}")
    return value


def _int(obj: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    """An integer field within the range of its slot in the record (400 naming it if not)."""
    return integer(obj.get(name, default), name, low, high)


def _host(obj: dict[str, Any]) -> str:
    host: str = _field(obj, "born_host", str, DEFAULT_BORN_HOST)
    port = host.rpartition(":")[2]
    if port.isdigit() and int(port) > MAX_PORT:
        raise ProtocolError(ErrorCode.BAD_REQUEST,
                            f"born_host: the port must be 0-{MAX_PORT}, got {port}")
    return host


def _body(obj: dict[str, Any]) -> bytes:
    raw = obj.get("body", b"")
    if isinstance(raw, bytes | bytearray):
        return bytes(raw)
    if not isinstance(raw, str):
        raise ProtocolError(ErrorCode.BAD_REQUEST, "body must be bytes or a string")
    if obj.get("body_encoding") == "base64":
        try:
            return base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ProtocolError(ErrorCode.INVALID_BODY_ENCODING,
                                "body is not valid base64") from exc
    return raw.encode("utf-8")


class InternalService:
    def __init__(self, store: MessageStore, topics: TopicManager, ingest: Ingest) -> None:
        self.store = store
        self.topics = topics
        self.ingest = ingest

    async def _topic(self, name: str) -> TopicConfig:
        validate_topic_name(name)
        if is_system_topic(name):
            cfg, _ = await self.topics.ensure_system(name)
            return cfg
        return self.topics.require(name)

    def parse_record(self, obj: Any, default_topic: str, now: int) -> MessageRecord:
        if not isinstance(obj, dict):
            raise ProtocolError(ErrorCode.BAD_REQUEST, "each record must be an object")
        reject_unknown(obj, RECORD_FIELDS, "a record")
        props = _field(obj, "properties", dict, {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in props.items()):
            raise ProtocolError(ErrorCode.BAD_REQUEST, "properties must map strings to strings")
        props = dict(props)
        props.setdefault(UNIQ_KEY, new_message_id())
        code = obj.get("tag_code")
        return MessageRecord(
            topic=_field(obj, "topic", str, default_topic),
            queue_id=_int(obj, "queue_id", 0, 0, INT32_MAX),
            body=_body(obj),
            properties=props,
            tag_code=tag_code(props.get(TAGS)) if code is None else _int(
                obj, "tag_code", 0, INT64_MIN, INT64_MAX),
            flag=_int(obj, "flag", 0, INT32_MIN, INT32_MAX),
            sys_flag=_int(obj, "sys_flag", 0, 0, INT32_MAX),
            born_timestamp=_int(obj, "born_timestamp_ms", now, 0, INT64_MAX),
            born_host=_host(obj),
            reconsume_times=_int(obj, "reconsume_times", 0, 0, INT32_MAX),
            prepared_tx_offset=_int(obj, "prepared_tx_offset", 0, 0, INT64_MAX),
        )

    async def put(self, default_topic: str, payload: Any) -> list[dict[str, Any]]:
        """``{records: [...], dedup: false}`` → one result per record, in order.

        With ``dedup`` a record whose (topic, UNIQ_KEY) was stored within the window is not
        stored again (a re-put after a crash); its first result is answered.
        """
        items = records_of(payload, PUT_FIELDS, "an internal write", "send", MAX_RECORDS)
        dedup = bool(payload.get("dedup", False))
        now = now_ms()
        records = []
        for i, item in enumerate(items):
            try:
                records.append(self.parse_record(item, default_topic, now))
            except ProtocolError as exc:
                raise ProtocolError(exc.code, f"records[{i}].{exc.message}") from None
        for record in records:
            cfg = await self._topic(record.topic)
            if not 0 <= record.queue_id < cfg.queues:
                raise ProtocolError(ErrorCode.BAD_REQUEST,
                                    f"queue_id {record.queue_id} does not exist: topic "
                                    f"{cfg.name!r} has queues 0-{cfg.queues - 1}")
        placed = await self.ingest.put_records(records, [dedup] * len(records), now)
        return [{"message_id": r.properties[UNIQ_KEY], "topic": r.topic,
                 "queue_id": p.queue_id, "queue_offset": p.queue_offset}
                for r, p in zip(records, placed, strict=True)]

    def read(self, physical_offset: int) -> StoredRecord:
        record = self.store.read(physical_offset) if physical_offset >= 0 else None
        if record is None:
            raise ProtocolError(ErrorCode.MESSAGE_NOT_FOUND,
                                f"no readable record at physical offset {physical_offset}")
        return record

    def set_retention_floor(self, owner: str, physical_offset: int) -> None:
        if not owner or physical_offset < 0:
            raise ProtocolError(ErrorCode.BAD_REQUEST,
                                "owner must be non-empty and physical_offset >= 0")
        self.store.set_retention_floor(owner, physical_offset)
