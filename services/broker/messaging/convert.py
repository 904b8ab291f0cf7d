"""Conversions between the wire Message (docs/api.md) and store records, in both directions.

``to_wire`` is the one record → returned-message function used by pull, receive and query;
``to_record`` builds the record a send stores. Property conventions (store/types.py):
``UNIQ_KEY`` = message_id, ``TAGS`` = tag, ``KEYS`` = keys joined by ``KEY_SEPARATOR``,
``SHARDING_KEY``; user properties as they are (the parser rejects reserved names).
"""

from __future__ import annotations

import base64
import ipaddress
import uuid
from typing import Any

from tidemq.protocol import (
    KEYS,
    RESERVED_PROPERTIES,
    RETRY_TOPIC,
    SHARDING_KEY,
    TAGS,
    UNIQ_KEY,
    OutgoingMessage,
)

from tidemq_server.broker.store.types import KEY_SEPARATOR, MessageRecord, StoredRecord, tag_code


def new_message_id() -> str:
    """The id of a message sent without one (32 hex characters, as the SDK's)."""
    return uuid.uuid4().hex


def born_host(host: str | None, port: int | None) -> str:
    """``ip:port`` of a client for the record (IPv4 only: the record keeps 8 bytes for it)."""
    try:
        ipaddress.IPv4Address(host or "")
    except ValueError:
        return "0.0.0.0:0"
    return f"{host}:{port or 0}"


def to_record(msg: OutgoingMessage, topic: str, queue_id: int, message_id: str,
              now_ms: int, host: str) -> MessageRecord:
    """The record a validated outgoing message is stored as."""
    props = dict(msg.properties) if msg.properties else {}
    props[UNIQ_KEY] = message_id
    tag = msg.tag
    if tag:
        props[TAGS] = tag
    if msg.keys:
        props[KEYS] = KEY_SEPARATOR.join(msg.keys)
    if msg.sharding_key is not None:
        props[SHARDING_KEY] = msg.sharding_key
    # positional (once per message on the send path): topic, queue_id, body, properties,
    # tag_code, flag, sys_flag, born_timestamp, born_host
    return MessageRecord(topic, queue_id, msg.body, props, tag_code(tag) if tag else 0, 0, 0,
                         now_ms, host)


def user_properties(props: dict[str, str]) -> dict[str, str]:
    """The properties a client sees: every name the system reserves is removed."""
    return {k: v for k, v in props.items() if k not in RESERVED_PROPERTIES}


def body_field(body: bytes, out: dict[str, Any], binary: bool) -> None:
    """Put ``body`` into ``out``: raw bytes (msgpack), else utf-8 text or base64 text with
    ``body_encoding`` saying which."""
    if binary:
        out["body"] = body
        return
    try:
        out["body"] = body.decode("utf-8")
        out["body_encoding"] = "utf-8"
    except UnicodeDecodeError:
        out["body"] = base64.b64encode(body).decode("ascii")
        out["body_encoding"] = "base64"


def to_wire(record: StoredRecord, binary: bool, *, topic: str | None = None,
            queue_id: int | None = None, queue_offset: int | None = None) -> dict[str, Any]:
    """A stored record as a returned Message (docs/api.md); msgpack (``binary``) keeps raw bytes.

    ``topic``/``queue_id``/``queue_offset`` override the record's own (a message shown where it
    will be delivered rather than where its current copy lives).
    """
    props = record.properties
    out: dict[str, Any] = {
        "message_id": props.get(UNIQ_KEY, ""),
        "topic": topic if topic is not None else record.topic,
        "queue_id": record.queue_id if queue_id is None else queue_id,
        "queue_offset": record.queue_offset if queue_offset is None else queue_offset,
    }
    body_field(record.body, out, binary)
    raw_keys = props.get(KEYS)
    out["tag"] = props.get(TAGS) or None
    out["keys"] = raw_keys.split(KEY_SEPARATOR) if raw_keys else []
    out["properties"] = user_properties(props)
    out["born_timestamp_ms"] = record.born_timestamp
    out["store_timestamp_ms"] = record.store_timestamp
    out["reconsume_times"] = record.reconsume_times
    origin = props.get(RETRY_TOPIC)
    if origin:
        out["origin_topic"] = origin
    return out


def to_internal_wire(record: StoredRecord, binary: bool) -> dict[str, Any]:
    """A stored record with everything the checker and scheduler need (raw properties too)."""
    out: dict[str, Any] = {
        "message_id": record.properties.get(UNIQ_KEY, ""),
        "topic": record.topic,
        "queue_id": record.queue_id,
        "queue_offset": record.queue_offset,
        "physical_offset": record.physical_offset,
        "size": record.size,
    }
    body_field(record.body, out, binary)
    out.update(
        properties=dict(record.properties),
        flag=record.flag,
        sys_flag=record.sys_flag,
        born_timestamp_ms=record.born_timestamp,
        born_host=record.born_host,
        store_timestamp_ms=record.store_timestamp,
        store_host=record.store_host,
        reconsume_times=record.reconsume_times,
        prepared_tx_offset=record.prepared_tx_offset,
    )
    return out
