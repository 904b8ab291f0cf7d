"""The Message of docs/api.md: limits, parsing and validation (server side), and received messages.

Parsing is hand-written rather than a pydantic model because it runs once per message on the
send hot path; it raises ``ProtocolError`` naming the field and the limit that failed.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from typing import Any

from tidemq.protocol.codes import ErrorCode, ProtocolError
from tidemq.protocol.numbers import INT32_MAX, INT64_MAX, integer
from tidemq.protocol.properties import is_reserved, reserved_text
from tidemq.protocol.tags import TAG_MAX, tag_problem

KiB = 1024
MiB = 1024 * KiB


@dataclass(frozen=True, slots=True)
class Limits:
    max_body_bytes: int = 4 * MiB  # one message body
    max_properties_bytes: int = 32 * KiB  # encoded properties (names + values + separators)
    max_batch_messages: int = 1024  # messages in one send request
    max_batch_bytes: int = 16 * MiB  # bodies + properties of one send request
    max_message_id_chars: int = 64
    max_delay_level: int = 18  # levels 1..max_delay_level
    max_delay_ms: int = 30 * 24 * 3600 * 1000  # arbitrary delay ceiling (30 days)


DEFAULT_LIMITS = Limits()

_FORBIDDEN_CHARS = ("\x00", "\x01", "\x02", "\x1f")
_HAS_FORBIDDEN = re.compile("[" + "".join(_FORBIDDEN_CHARS) + "]").search
has_forbidden = _HAS_FORBIDDEN  # whether text holds a control character the record format uses
#: The delay fields: a message without any of them needs no delay checks.
_DELAY_FIELDS = ("delay_level", "delay_ms", "deliver_at_ms")

#: The fields of a Message (docs/api.md); a message with any other field is refused, naming it.
MESSAGE_FIELDS = frozenset({
    "message_id", "body", "body_encoding", "tag", "keys", "properties", "queue_id",
    "sharding_key", "delay_level", "delay_ms", "deliver_at_ms",
})
SEND_FIELDS = frozenset({"messages"})  # of a send request


@dataclass(slots=True)
class OutgoingMessage:
    """A validated message as a client sent it (before the broker stores it)."""

    body: bytes
    message_id: str | None = None
    tag: str | None = None
    keys: list[str] = field(default_factory=list)
    properties: dict[str, str] = field(default_factory=dict)
    queue_id: int | None = None
    sharding_key: str | None = None
    delay_level: int = 0
    delay_ms: int | None = None
    deliver_at_ms: int | None = None

    def properties_size(self) -> int:
        if not self.properties:
            return 0
        return sum(len(k) + len(v) + 2 for k, v in self.properties.items())

    def to_wire(self, *, binary: bool) -> dict[str, Any]:
        """The request form: raw bytes for msgpack, utf-8 or base64 text for JSON."""
        if binary:
            out: dict[str, Any] = {"body": self.body}
        else:
            out = {}
            try:
                out["body"] = self.body.decode("utf-8")
            except UnicodeDecodeError:
                out["body"] = base64.b64encode(self.body).decode("ascii")
                out["body_encoding"] = "base64"
        if self.message_id is not None:
            out["message_id"] = self.message_id
        if self.tag:
            out["tag"] = self.tag
        if self.keys:
            out["keys"] = list(self.keys)
        if self.properties:
            out["properties"] = dict(self.properties)
        if self.queue_id is not None and self.sharding_key is None:  # the key decides the
            out["queue_id"] = self.queue_id  # queue on the broker (the SDK chose the broker)
        if self.sharding_key is not None:
            out["sharding_key"] = self.sharding_key
        if self.delay_level:
            out["delay_level"] = self.delay_level
        if self.delay_ms is not None:
            out["delay_ms"] = self.delay_ms
        if self.deliver_at_ms is not None:
            out["deliver_at_ms"] = self.deliver_at_ms
        return out


def _bad(field_name: str, what: str, code: ErrorCode = ErrorCode.BAD_REQUEST) -> ProtocolError:
    return ProtocolError(code, f"{field_name}: {what}")


def _text(obj: dict[str, Any], name: str, limit: int = 1024) -> str | None:
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _bad(name, f"must be a string, got {type(value).__name__}")
    if len(value) > limit:
        raise _bad(name, f"at most {limit} characters, got {len(value)}")
    if not value.isalnum() and _HAS_FORBIDDEN(value):  # isalnum: ids in one cheap step
        raise _bad(name, "must not contain control characters \\x00 \\x01 \\x02 \\x1f")
    return value


def _int(obj: dict[str, Any], name: str, low: int, high: int,
         code: ErrorCode = ErrorCode.BAD_REQUEST, rule: str | None = None) -> int | None:
    """The integer field ``name`` (None when absent), in ``[low, high]`` (see numbers.integer)."""
    value = obj.get(name)
    if value is None:
        return None
    return integer(value, name, low, high, code, rule)


def _body(obj: dict[str, Any], limits: Limits) -> bytes:
    raw = obj.get("body", "")
    if type(raw) is bytes and "body_encoding" not in obj:  # msgpack: the common case
        if len(raw) > limits.max_body_bytes:
            raise _body_too_large(raw, limits)
        return raw
    encoding = obj.get("body_encoding", "utf-8")
    if isinstance(raw, bytes | bytearray):
        body = bytes(raw)
    elif not isinstance(raw, str):
        raise _bad("body", f"must be a string (or bytes in msgpack), got {type(raw).__name__}")
    elif encoding in ("utf-8", "utf8", None):
        body = raw.encode("utf-8")
    elif encoding == "base64":
        try:
            body = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise _bad("body", "is not valid base64", ErrorCode.INVALID_BODY_ENCODING) from exc
    else:
        raise _bad(
            "body_encoding",
            f"must be 'utf-8' or 'base64', got {encoding!r}",
            ErrorCode.INVALID_BODY_ENCODING,
        )
    if len(body) > limits.max_body_bytes:
        raise _body_too_large(body, limits)
    return body


def _body_too_large(body: bytes, limits: Limits) -> ProtocolError:
    return _bad("body", f"{len(body)} bytes exceeds the limit of {limits.max_body_bytes} bytes",
                ErrorCode.MESSAGE_TOO_LARGE)


def _properties(obj: dict[str, Any], limits: Limits) -> dict[str, str]:
    props = obj.get("properties")
    if props is None:
        return {}
    if not isinstance(props, dict):
        raise _bad("properties", "must be an object of string values")
    size = 0
    for k, v in props.items():
        if not isinstance(k, str) or not isinstance(v, str) or not k:
            raise _bad("properties", f"names and values must be strings, got {k!r}: {v!r}")
        if is_reserved(k):
            raise _bad("properties", reserved_text(k))
        if _HAS_FORBIDDEN(k) or _HAS_FORBIDDEN(v):
            raise _bad("properties", f"{k!r} must not contain control characters")
        size += len(k.encode()) + len(v.encode()) + 2
    if size > limits.max_properties_bytes:
        raise _bad(
            "properties",
            f"{size} bytes exceeds the limit of {limits.max_properties_bytes} bytes",
            ErrorCode.MESSAGE_TOO_LARGE,
        )
    return props


def _delays(obj: dict[str, Any], msg: OutgoingMessage, limits: Limits) -> None:
    invalid = ErrorCode.INVALID_DELAY
    level = _int(obj, "delay_level", 0, limits.max_delay_level, invalid,
                 f"1-{limits.max_delay_level} (or 0 for none)") or 0
    delay_ms = _int(obj, "delay_ms", 0, limits.max_delay_ms, invalid,
                    f"0-{limits.max_delay_ms} ms (the maximum delay)")
    # the broker, which knows the time, holds it to now + the maximum delay
    deliver_at = _int(obj, "deliver_at_ms", 0, INT64_MAX, invalid,
                      f"epoch milliseconds at most {limits.max_delay_ms} ms (the maximum "
                      "delay) from now")
    given = [n for n, v in (("delay_level", level or None), ("delay_ms", delay_ms),
                            ("deliver_at_ms", deliver_at)) if v is not None]
    if len(given) > 1:
        raise _bad("delay", f"give at most one of delay_level, delay_ms, deliver_at_ms; got "
                   f"{', '.join(given)}", ErrorCode.INVALID_DELAY)
    msg.delay_level, msg.delay_ms, msg.deliver_at_ms = level, delay_ms, deliver_at


def reject_unknown(obj: dict[Any, Any], known: frozenset[str], what: str) -> None:
    """400 BAD_REQUEST naming a field of ``obj`` that is not in ``known`` (a misspelt field
    would otherwise be ignored silently). One subset test on the keys when all are known."""
    if obj.keys() <= known:
        return
    name = sorted(str(k) for k in obj.keys() - known)[0]
    raise _bad(name, f"unknown field: {what} has only {', '.join(sorted(known))}")


def parse_message(obj: Any, limits: Limits = DEFAULT_LIMITS) -> OutgoingMessage:
    """Validate one wire message; raises ProtocolError naming the field that is wrong.

    ``deliver_at_ms`` is checked against the maximum delay by the broker, which knows the time.
    """
    if not isinstance(obj, dict):
        raise _bad("message", "must be an object")
    reject_unknown(obj, MESSAGE_FIELDS, "a message")
    message_id = _text(obj, "message_id", limits.max_message_id_chars)
    if message_id == "":
        raise _bad("message_id", "must not be empty")
    keys = obj.get("keys") or []
    if keys:
        if isinstance(keys, str):
            keys = [keys]
        if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
            raise _bad("keys", "must be a list of non-empty strings")
        for k in keys:
            _text({"keys": k}, "keys")
    queue_id = _int(obj, "queue_id", 0, INT32_MAX)
    sharding_key = _text(obj, "sharding_key")
    if queue_id is not None and sharding_key is not None:
        raise _bad("queue_id", "give queue_id (a fixed queue) or sharding_key (the key's "
                   "queue), not both")
    tag = _text(obj, "tag", TAG_MAX) or None
    if tag is not None and not tag.isalnum():  # isalnum: most tags in one cheap step
        problem = tag_problem(tag)
        if problem:
            raise _bad("tag", f"{tag!r} {problem}")
    msg = OutgoingMessage(
        _body(obj, limits),
        message_id,
        tag,
        keys,
        _properties(obj, limits),
        queue_id,
        sharding_key,
    )
    for name in _DELAY_FIELDS:
        if name in obj:
            _delays(obj, msg, limits)
            break
    return msg


def parse_messages(payload: Any, limits: Limits = DEFAULT_LIMITS) -> list[OutgoingMessage]:
    """Validate a send request ``{messages: [...]}`` as a whole."""
    if not isinstance(payload, dict) or not isinstance(payload.get("messages"), list):
        raise _bad("messages", "the body must be {\"messages\": [Message, ...]}")
    reject_unknown(payload, SEND_FIELDS, "a send request")
    items = payload["messages"]
    if not items:
        raise _bad("messages", "must hold at least one message")
    if len(items) > limits.max_batch_messages:
        raise _bad("messages", f"{len(items)} messages exceeds the batch limit of "
                   f"{limits.max_batch_messages}", ErrorCode.MESSAGE_TOO_LARGE)
    out: list[OutgoingMessage] = []
    total = 0
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        try:
            msg = parse_message(item, limits)
        except ProtocolError as exc:
            raise ProtocolError(exc.code, f"messages[{i}].{exc.message}") from None
        total += len(msg.body) + msg.properties_size()
        if msg.message_id is not None:
            first = seen.setdefault(msg.message_id, i)
            if first != i and out[first] != msg:
                raise _bad(f"messages[{i}].message_id", f"{msg.message_id!r} is also "
                           f"messages[{first}], with other content: one id names one message")
        out.append(msg)
    if total > limits.max_batch_bytes:
        raise _bad("messages", f"batch of {total} bytes exceeds the limit of "
                   f"{limits.max_batch_bytes} bytes", ErrorCode.MESSAGE_TOO_LARGE)
    return out


#: A property users do see (so not in ``properties.py``): why a consumer failed on a message,
#: set on its retry and DLQ copies from the reason a client gives with its hand-back
#: (``POST /v1/groups/{group}/retry`` ``reason``; the SDK sends the handler's exception). A copy
#: handed back without a reason has none.
CONSUME_FAILURE = "TIDE_CONSUME_FAILURE"
MAX_CONSUME_FAILURE_CHARS = 1024  # longest reason the broker keeps (the SDK cuts it to fit)


@dataclass(slots=True)
class ReceivedMessage:
    """A message as the broker returns it (pull, receive, query)."""

    message_id: str
    topic: str
    queue_id: int
    queue_offset: int
    body: bytes
    tag: str | None = None
    keys: list[str] = field(default_factory=list)
    properties: dict[str, str] = field(default_factory=dict)
    born_timestamp_ms: int = 0
    store_timestamp_ms: int = 0
    reconsume_times: int = 0
    receipt_handle: str | None = None
    state: str | None = None
    origin_topic: str | None = None  # for retry and DLQ copies: the topic first consumed from
    # why the last attempt to consume it in this process failed (a push consumer sets it and
    # sends it with the hand-back to the retry topic); never on the wire
    failure: str | None = None

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")

    @classmethod
    def from_wire(cls, obj: dict[str, Any]) -> ReceivedMessage:
        body = obj.get("body", b"")
        if isinstance(body, str):
            body = (base64.b64decode(body) if obj.get("body_encoding") == "base64"
                    else body.encode("utf-8"))
        return cls(
            message_id=obj["message_id"],
            topic=obj["topic"],
            queue_id=obj.get("queue_id", 0),
            queue_offset=obj.get("queue_offset", 0),
            body=bytes(body),
            tag=obj.get("tag"),
            keys=list(obj.get("keys") or []),
            properties=dict(obj.get("properties") or {}),
            born_timestamp_ms=obj.get("born_timestamp_ms", 0),
            store_timestamp_ms=obj.get("store_timestamp_ms", 0),
            reconsume_times=obj.get("reconsume_times", 0),
            receipt_handle=obj.get("receipt_handle"),
            state=obj.get("state"),
            origin_topic=obj.get("origin_topic"),
        )
