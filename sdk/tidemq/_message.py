"""What users send and get back: ``Message``, ``SendResult``, and their checks before sending.

Received messages are ``tidemq.protocol.ReceivedMessage`` (also ``tidemq.ReceivedMessage``).
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tidemq import _validate as V
from tidemq._exceptions import ConfigurationError, server_error
from tidemq.protocol import ErrorCode, OutgoingMessage, ProtocolError, validate_topic_name
from tidemq.protocol.message import DEFAULT_LIMITS, Limits
from tidemq.protocol.properties import is_reserved, reserved_text

#: Random bits of message ids: a private generator (a user's ``random.seed`` cannot make two
#: processes repeat each other's ids), seeded from ``os.urandom`` and again in a forked child.
_ids = random.Random()
os.register_at_fork(after_in_child=_ids.seed)
_UUID4_CLEAR = ~((0xF << 76) | (0x3 << 62))  # the version and variant bits of a uuid4 ...
_UUID4_SET = (0x4 << 76) | (0x2 << 62)  # ... set to version 4, variant RFC 4122


def new_message_id() -> str:
    """A fresh message id: 32 hex characters (uuid4), well under the 64-character limit.

    The same form as ``uuid.uuid4().hex`` (122 random bits), drawn without a system call per id
    (``bytes.hex`` of the 16 bytes: a third of the time of a ``:032x`` format, once a message).
    """
    return (_ids.getrandbits(128) & _UUID4_CLEAR | _UUID4_SET).to_bytes(16, "big").hex()


def new_client_id() -> str:
    """``host@pid@random``: unique per client instance, readable in member lists and traces."""
    return f"{socket.gethostname()}@{os.getpid()}@{_ids.getrandbits(32):08x}"


@dataclass(slots=True, init=False)
class Message:
    """A message to send. ``body`` text is sent as UTF-8.

    At most one of ``delay_level`` (1-18), ``delay_ms`` and ``deliver_at_ms`` may be set.
    ``delay_ms`` is milliseconds (an int or a whole float) or a ``datetime.timedelta``;
    ``deliver_at_ms`` is epoch milliseconds (an int or a whole float) or a ``datetime.datetime``
    (an aware one, or a naive one read as local time); both are kept as int milliseconds,
    rounded down. ``sharding_key`` pins all messages with the same key to one queue (ordered
    messages); ``queue_id`` pins a queue explicitly. ``keys`` is one string or a list of
    strings, ``properties`` a mapping of strings to strings. Leave ``message_id`` empty to get
    a fresh one per ``send`` call (the SDK always sends one, so its own retries are
    idempotent); set it to make your own retries of the same logical message idempotent too.

    An argument of the wrong type (a ``str`` delay, a ``bool`` queue id, an int tag) raises
    ``ConfigurationError`` naming it (``tidemq._validate``).
    """

    body: bytes | str
    topic: str | None
    tag: str | None
    keys: Sequence[str] | str
    properties: Mapping[str, str]
    sharding_key: str | None
    queue_id: int | None
    delay_level: int
    delay_ms: int | None
    deliver_at_ms: int | None
    message_id: str | None

    def __init__(  # the order of the fields: Message(body, topic, tag, ...) stays valid
        self,
        body: bytes | str,
        topic: str | None = None,
        tag: str | None = None,
        keys: Sequence[str] | str = (),
        properties: Mapping[str, str] | None = None,
        sharding_key: str | None = None,
        queue_id: int | None = None,
        delay_level: int | None = 0,
        delay_ms: V.Duration | None = None,
        deliver_at_ms: V.Instant | None = None,
        message_id: str | None = None,
    ) -> None:
        self.body = body
        self.topic = topic if topic is None or type(topic) is str else V.text(topic, "topic")
        self.tag = tag if tag is None or type(tag) is str else V.text(tag, "tag")
        self.keys = keys if type(keys) is str or keys == () else V.keys(keys)
        self.properties = {} if properties is None \
            else properties if type(properties) is dict and not properties \
            else V.properties(properties)
        self.sharding_key = sharding_key if sharding_key is None or type(sharding_key) is str \
            else V.text(sharding_key, "sharding_key")
        self.queue_id = queue_id if queue_id is None or type(queue_id) is int \
            else V.integer(queue_id, "queue_id")
        self.delay_level = delay_level if type(delay_level) is int \
            else 0 if delay_level is None else V.integer(delay_level, "delay_level")
        self.delay_ms = delay_ms if delay_ms is None or type(delay_ms) is int \
            else V.duration_ms(delay_ms)
        self.deliver_at_ms = deliver_at_ms if deliver_at_ms is None or type(deliver_at_ms) is int \
            else V.epoch_ms(deliver_at_ms)
        self.message_id = message_id if message_id is None or type(message_id) is str \
            else V.text(message_id, "message_id")


@dataclass(frozen=True, slots=True)
class SendResult:
    """Where the broker stored a message: its id, topic, queue and offset within the queue.

    A delayed message has no offset until it is delivered: ``queue_offset`` is None,
    ``queue_id`` is the queue it will be delivered to, ``state`` is ``"scheduled"`` and
    ``deliver_at_ms`` its due time (epoch ms). Sending a delayed message id again answers its
    first result, with ``state`` ``"cancelled"`` once it was cancelled (nothing is scheduled
    again) or ``"stored"`` with its position once it was delivered.

    ``broker_name`` is the broker group that stored it (from the route used): what
    ``cancel_delayed`` asks first. None when the client could not tell.
    """

    message_id: str
    topic: str
    queue_id: int
    queue_offset: int | None
    state: str = "stored"
    deliver_at_ms: int | None = None
    broker_name: str | None = None

    @property
    def scheduled(self) -> bool:
        """True while the message waits for its delivery time (no queue offset yet)."""
        return self.state == "scheduled"


_new = object.__new__
# the slots' own setters: a frozen dataclass's __init__ goes through object.__setattr__ by
# name for each field (~2x the time; results are made once per message sent)
_set_id, _set_topic, _set_queue, _set_offset, _set_state, _set_due, _set_broker = (
    getattr(SendResult, f).__set__ for f in ("message_id", "topic", "queue_id", "queue_offset",
                                             "state", "deliver_at_ms", "broker_name"))


def stored_result(message_id: str, topic: str, queue_id: int, queue_offset: int,
                  broker_name: str | None) -> SendResult:
    """``SendResult(message_id, topic, queue_id, queue_offset, broker_name=broker_name)`` of a
    stored message, built without the frozen dataclass's ``__init__``: the same object."""
    r: SendResult = _new(SendResult)
    _set_id(r, message_id)
    _set_topic(r, topic)
    _set_queue(r, queue_id)
    _set_offset(r, queue_offset)
    _set_state(r, "stored")
    _set_due(r, None)
    _set_broker(r, broker_name)
    return r


def validate_topic(topic: str, valid: set[str]) -> None:
    """Raise the broker's error for an invalid topic name; ``valid`` remembers the names that
    passed, so a producer checks each of its topics once."""
    if topic in valid:
        return
    try:
        validate_topic_name(topic)
    except ProtocolError as exc:
        raise server_error(exc.code, exc.message) from None
    valid.add(topic)


def to_outgoing(message: Message, limits: Limits = DEFAULT_LIMITS) -> OutgoingMessage:
    """The wire form of ``message``, with a message id, checked the way the broker would.

    Checking here means one bad message fails its own ``send`` and never the coalesced batch
    it would have shared with other callers. Raises the same exception classes the broker's
    answer would (``MessageTooLargeError``, ``InvalidDelayError``, ``BadRequestError``).
    """
    body = message.body.encode("utf-8") if isinstance(message.body, str) else message.body
    if not isinstance(body, bytes | bytearray | memoryview):
        raise ConfigurationError(f"body must be bytes or str, got {type(message.body).__name__}")
    body = bytes(body)
    if len(body) > limits.max_body_bytes:
        raise _body_too_large(body, limits)
    message_id = _valid_id(message.message_id, limits)
    keys = [message.keys] if isinstance(message.keys, str) else list(message.keys)
    if has_delay(message):
        _validate_delay(message, limits)
    if message.queue_id is not None and message.queue_id < 0:
        raise server_error(ErrorCode.BAD_REQUEST, f"queue_id: must be >= 0, got "
                           f"{message.queue_id}")
    if message.queue_id is not None and message.sharding_key is not None:
        raise server_error(ErrorCode.BAD_REQUEST, "queue_id: give queue_id (a fixed queue) or "
                           "sharding_key (the key's queue), not both")
    out = OutgoingMessage(body, message_id, message.tag or None, keys, dict(message.properties),
                          message.queue_id, message.sharding_key, message.delay_level,
                          message.delay_ms, message.deliver_at_ms)
    _validate_properties(out, limits)
    return out


def has_delay(message: Message | OutgoingMessage) -> bool:
    """Whether ``message`` is delayed: a delay level, ``delay_ms`` or ``deliver_at_ms``."""
    return bool(message.delay_level) or message.delay_ms is not None \
        or message.deliver_at_ms is not None


def body_to_outgoing(body: bytes | str, limits: Limits = DEFAULT_LIMITS, *,
                     message_id: str | None = None,
                     properties: Mapping[str, str] | None = None) -> OutgoingMessage:
    """``to_outgoing(Message(body, message_id=..., properties=...))`` without building the
    ``Message``: a bare body, with at most the id and properties a tracer adds
    (``tidemq.otel``), has nothing else to check."""
    raw = body.encode("utf-8") if isinstance(body, str) else body
    if len(raw) > limits.max_body_bytes:
        raise _body_too_large(raw, limits)
    out = OutgoingMessage(raw, _valid_id(message_id, limits))
    if properties:
        out.properties = dict(V.properties(properties))
        _validate_properties(out, limits)
    return out


def _valid_id(message_id: str | None, limits: Limits) -> str:
    """The caller's message id, checked, or a fresh one."""
    if not message_id:
        return new_message_id()
    if type(message_id) is not str:
        V.text(message_id, "message_id")
    if len(message_id) > limits.max_message_id_chars:
        raise server_error(ErrorCode.BAD_REQUEST, f"message_id: at most "
                           f"{limits.max_message_id_chars} characters, got {len(message_id)}")
    return message_id


def _validate_properties(out: OutgoingMessage, limits: Limits) -> None:
    if not out.properties:
        return
    for name in out.properties:  # refused here as the broker would (400), before sending
        if is_reserved(name):
            raise server_error(ErrorCode.BAD_REQUEST, f"properties: {reserved_text(name)}")
    if out.properties_size() > limits.max_properties_bytes:
        raise server_error(ErrorCode.MESSAGE_TOO_LARGE, f"properties: {out.properties_size()} "
                           f"bytes exceeds the limit of {limits.max_properties_bytes} bytes")


def _body_too_large(body: bytes, limits: Limits) -> Exception:
    return server_error(ErrorCode.MESSAGE_TOO_LARGE, f"body: {len(body)} bytes exceeds the "
                        f"limit of {limits.max_body_bytes} bytes")


def _validate_delay(message: Message, limits: Limits) -> None:
    """The delay fields of ``message`` (one at most, each in range), as the broker checks them."""
    delays = [name for name, value in (("delay_level", message.delay_level or None),
                                       ("delay_ms", message.delay_ms),
                                       ("deliver_at_ms", message.deliver_at_ms))
              if value is not None]
    if len(delays) > 1:
        raise server_error(ErrorCode.INVALID_DELAY, "give at most one of delay_level, "
                           f"delay_ms, deliver_at_ms; got {', '.join(delays)}")
    if not 0 <= message.delay_level <= limits.max_delay_level:
        raise server_error(ErrorCode.INVALID_DELAY, f"delay_level: must be "
                           f"1-{limits.max_delay_level} (or 0 for none), got {message.delay_level}")
    if message.delay_ms is not None and not 0 <= message.delay_ms <= limits.max_delay_ms:
        raise server_error(ErrorCode.INVALID_DELAY, f"delay_ms: must be "
                           f"0-{limits.max_delay_ms} ms, got {message.delay_ms}")


def wire_size(message: OutgoingMessage) -> int:
    """What ``message`` adds to a batch's byte bound (docs/api.md counts body + properties)."""
    return len(message.body) + message.properties_size()
