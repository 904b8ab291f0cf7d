"""Messages between ``apache.rocketmq.v2.Message`` and tidemq's own forms.

Inbound, a protobuf message becomes the wire Message of docs/api.md (a dict), so that the gRPC front
door sends through the very parser and send path the REST route uses. Outbound, a stored record
becomes a protobuf message with the system properties the official clients read: message id,
tag, keys, message group, type, timestamps, queue position, delivery attempt, receipt handle and
an MD5 body digest.

RocketMQ → tidemq: ``message_group`` → ``sharding_key`` (same group, same queue: FIFO);
``delivery_timestamp`` → ``deliver_at_ms``; ``user_properties`` → ``properties``.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import zlib
from dataclasses import dataclass
from typing import Any

from tidemq.protocol import properties as prop

from tidemq_server.broker.grpc.errors import RpcRefused
from tidemq_server.broker.grpc.proto import (
    Code,
    MessageType,
    duration_ms,
    pb,
    set_duration,
    set_timestamp,
    timestamp_ms,
)
from tidemq_server.broker.messaging.convert import user_properties
from tidemq_server.broker.store.types import KEY_SEPARATOR, StoredRecord, SysFlag

#: A delivery timestamp whose ``seconds`` exceed this is read as milliseconds: the official
#: Python client (5.x) copies ``Message.delivery_timestamp``, documented in ms, into ``seconds``.
#: 10^11 s is the year 5138, so no real timestamp in seconds is misread.
MS_IN_SECONDS_FIELD = 10**11

#: Stored properties that tell a delayed message (set by the send paths); the property names
#: go through the ``prop`` module here because ``DELAY`` below is a MessageType.
DELAY_PROPERTIES = (prop.DELAY, prop.DELAY_MS, prop.TIMER_DELIVER_MS)

# MessageType values as plain ints (the enum wrapper's attribute lookups are slow per message)
UNSPECIFIED, NORMAL, FIFO, DELAY, TRANSACTION = (
    int(MessageType.Value(n)) for n in ("MESSAGE_TYPE_UNSPECIFIED", "NORMAL", "FIFO", "DELAY",
                                        "TRANSACTION"))
SUPPORTED_TYPES = frozenset({NORMAL, FIFO, DELAY, TRANSACTION})


@dataclass(slots=True)
class Inbound:
    """One message of a SendMessageRequest, ready for tidemq's send paths."""

    topic: str
    kind: int  # MessageType
    wire: dict[str, Any]  # the docs/api.md Message
    check_immunity_s: int | None = None  # transactional: orphaned_transaction_recovery_duration


def delivery_ms(sp: Any) -> int | None:
    """The delivery time (epoch ms) in a message's system properties, None when absent."""
    if not sp.HasField("delivery_timestamp"):
        return None
    ts = sp.delivery_timestamp
    if ts.seconds > MS_IN_SECONDS_FIELD:
        return int(ts.seconds)
    return timestamp_ms(ts)


def message_kind(sp: Any) -> int:
    """The declared message type, or the one its fields imply when the client left it out."""
    kind = int(sp.message_type)
    if kind != UNSPECIFIED:
        return kind
    if sp.message_group:
        return FIFO
    if sp.HasField("delivery_timestamp"):
        return DELAY
    return NORMAL


def inbound(msg: Any, max_body_bytes: int) -> Inbound:
    """Check one protobuf message against its type and convert it; raises RpcRefused."""
    sp = msg.system_properties
    if not msg.topic.name:
        raise RpcRefused(Code.ILLEGAL_TOPIC, "message without a topic")
    if not sp.message_id:
        raise RpcRefused(Code.ILLEGAL_MESSAGE_ID, "system_properties.message_id is empty")
    kind = message_kind(sp)
    if kind not in SUPPORTED_TYPES:
        raise RpcRefused(Code.UNSUPPORTED,
                         f"message type {_type_name(kind)} is not supported by tidemq")
    due = delivery_ms(sp)
    if kind == FIFO and not sp.message_group:
        raise RpcRefused(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                         "a FIFO message needs a message_group")
    if kind == DELAY and due is None:
        raise RpcRefused(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                         "a DELAY message needs a delivery_timestamp")
    if kind in (NORMAL, TRANSACTION) and due is not None:
        raise RpcRefused(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                         f"a {_type_name(kind)} message must not carry a delivery_timestamp; "
                         "send it as DELAY")
    wire: dict[str, Any] = {"message_id": sp.message_id, "body": _body(msg, max_body_bytes)}
    if sp.HasField("tag") and sp.tag:
        wire["tag"] = sp.tag
    if sp.keys:
        wire["keys"] = list(sp.keys)
    if msg.user_properties:
        wire["properties"] = dict(msg.user_properties)
    if sp.message_group:
        wire["sharding_key"] = sp.message_group
    if due is not None:
        wire["deliver_at_ms"] = due
    immunity = None
    if kind == TRANSACTION and sp.HasField("orphaned_transaction_recovery_duration"):
        immunity = max(0, duration_ms(sp.orphaned_transaction_recovery_duration) // 1000) or None
    return Inbound(msg.topic.name, kind, wire, immunity)


def _body(msg: Any, limit: int) -> bytes:
    """The body as stored: a GZIP-encoded body (Java clients compress large ones) is inflated."""
    body = bytes(msg.body)
    if msg.system_properties.body_encoding != pb.Encoding.GZIP:
        return body
    try:
        if body[:2] == b"\x1f\x8b":
            with gzip.GzipFile(fileobj=io.BytesIO(body)) as f:
                out = f.read(limit + 1)
        else:
            out = zlib.decompressobj().decompress(body, limit + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise RpcRefused(Code.MESSAGE_CORRUPTED, f"body is not valid GZIP: {exc}") from None
    if len(out) > limit:
        raise RpcRefused(Code.MESSAGE_BODY_TOO_LARGE,
                         f"inflated body exceeds the limit of {limit} bytes")
    return out


def md5_hex(body: bytes) -> str:
    """The body digest the clients verify: upper-case hex MD5."""
    return hashlib.md5(body, usedforsecurity=False).hexdigest().upper()


def _type_name(kind: int) -> str:
    try:
        return str(MessageType.Name(kind))
    except ValueError:
        return str(kind)


def stored_kind(record: StoredRecord) -> int:
    props = record.properties
    if record.sys_flag & SysFlag.TYPE_MASK == SysFlag.COMMIT or props.get(prop.TRAN_MSG):
        return TRANSACTION
    if any(p in props for p in DELAY_PROPERTIES):
        return DELAY
    if prop.SHARDING_KEY in props:
        return FIFO
    return NORMAL


def outbound(record: StoredRecord, *, topic: str | None = None, receipt_handle: str | None = None,
             delivery_attempt: int | None = None, invisible_ms: int | None = None) -> Any:
    """A stored record as the protobuf message a consumer (or a transaction check) gets."""
    props = record.properties
    msg = pb.Message(body=record.body)
    msg.topic.name = topic or record.topic
    msg.user_properties.update(user_properties(props))
    sp = msg.system_properties
    sp.message_id = props.get(prop.UNIQ_KEY, "")
    if props.get(prop.TAGS):
        sp.tag = props[prop.TAGS]
    if props.get(prop.KEYS):
        sp.keys.extend(props[prop.KEYS].split(KEY_SEPARATOR))
    sp.body_digest.type = pb.DigestType.MD5
    sp.body_digest.checksum = md5_hex(record.body)
    sp.body_encoding = pb.Encoding.IDENTITY
    sp.message_type = stored_kind(record)
    set_timestamp(sp.born_timestamp, record.born_timestamp)
    sp.born_host = record.born_host.rsplit(":", 1)[0]
    set_timestamp(sp.store_timestamp, record.store_timestamp)
    sp.store_host = record.store_host
    due = props.get(prop.TIMER_DELIVER_MS)
    if due and due.isdigit():
        set_timestamp(sp.delivery_timestamp, int(due))
    sp.queue_id = record.queue_id
    sp.queue_offset = record.queue_offset
    if prop.SHARDING_KEY in props:
        sp.message_group = props[prop.SHARDING_KEY]
    if receipt_handle is not None:
        sp.receipt_handle = receipt_handle
    if delivery_attempt is not None:
        sp.delivery_attempt = delivery_attempt
    if invisible_ms is not None:
        set_duration(sp.invisible_duration, invisible_ms)
    return msg


def from_wire(wire: dict[str, Any], topic: str) -> Any:
    """A returned Message of docs/api.md (msgpack form: raw body) as a protobuf transactional
    message: what a producer is shown when it is asked to check a transaction."""
    body = wire.get("body", b"")
    msg = pb.Message(body=body if isinstance(body, bytes) else str(body).encode("utf-8"))
    msg.topic.name = topic
    msg.user_properties.update(wire.get("properties") or {})
    sp = msg.system_properties
    sp.message_id = wire.get("message_id", "")
    if wire.get("tag"):
        sp.tag = wire["tag"]
    sp.keys.extend(wire.get("keys") or [])
    sp.body_digest.type = pb.DigestType.MD5
    sp.body_digest.checksum = md5_hex(msg.body)
    sp.body_encoding = pb.Encoding.IDENTITY
    sp.message_type = TRANSACTION
    set_timestamp(sp.born_timestamp, int(wire.get("born_timestamp_ms") or 0))
    set_timestamp(sp.store_timestamp, int(wire.get("store_timestamp_ms") or 0))
    sp.queue_id = int(wire.get("queue_id") or 0)
    return msg
