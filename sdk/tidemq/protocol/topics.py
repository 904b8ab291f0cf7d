"""Topics and groups: the name rule, every system topic (the one place they are named) and the
topic permission."""

from __future__ import annotations

import re
from enum import StrEnum

from tidemq.protocol.codes import ErrorCode, ProtocolError

TOPIC_NAME_RE = re.compile(r"^[A-Za-z0-9_%|-]{1,127}$")
GROUP_NAME_RE = re.compile(r"^[A-Za-z0-9_%|-]{1,127}$")

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"


class SystemTopic(StrEnum):
    TRANS_HALF = "RMQ_SYS_TRANS_HALF_TOPIC"  # half (prepared) transactional messages
    TRANS_OP_HALF = "RMQ_SYS_TRANS_OP_HALF_TOPIC"  # op records: a half message was ended
    TRANS_CHECK_MAX = "TRANS_CHECK_MAX_TIME_TOPIC"  # discarded half messages
    TRANS_EVENTS = "TIDE_SYS_TRANS_EVENTS"  # transaction state events (metrics input)
    SCHEDULE = "SCHEDULE_TOPIC_XXXX"  # delay-level messages, queue = level - 1
    TIMER_INTAKE = "TIDE_SYS_TIMER_INTAKE"  # arbitrary-delay messages for the scheduler
    TIMER_CANCELS = "TIDE_SYS_TIMER_CANCELS"  # the broker's durable record of cancelled timers


class Perm(StrEnum):
    """A topic's permission (the ``perm`` field of docs/api.md's topic)."""

    READ_WRITE = "rw"  # producers send, consumers pull
    READ = "r"  # pull only (e.g. a topic being drained)
    WRITE = "w"  # send only

    @property
    def readable(self) -> bool:
        return self is not Perm.WRITE

    @property
    def writable(self) -> bool:
        return self is not Perm.READ


_SYSTEM_PREFIXES = ("RMQ_SYS_", "rmq_sys_", "TIDE_SYS_", RETRY_PREFIX, DLQ_PREFIX)
_SYSTEM_NAMES = frozenset({SystemTopic.SCHEDULE.value, SystemTopic.TRANS_CHECK_MAX.value})


def is_system_topic(topic: str) -> bool:
    """True for names the public API may read but never write or create."""
    return topic in _SYSTEM_NAMES or topic.startswith(_SYSTEM_PREFIXES)


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


def parse_perm(value: str) -> Perm:
    try:
        return Perm(value)
    except ValueError:
        raise ProtocolError(ErrorCode.BAD_REQUEST,
                            f"perm must be 'rw', 'r' or 'w', got {value!r}") from None


def validate_topic_name(topic: str) -> str:
    if not isinstance(topic, str) or not TOPIC_NAME_RE.match(topic):
        raise ProtocolError(
            ErrorCode.INVALID_TOPIC_NAME,
            f"topic name {topic!r} must match {TOPIC_NAME_RE.pattern} (1-127 characters)",
        )
    return topic


CLIENT_ID_MAX = 255  # characters of a client_id (consumer and producer heartbeats)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")  # C0, DEL, C1, line separators


def validate_client_id(client_id: object) -> str:
    """A consumer's or producer's ``client_id``: 1-255 characters, no control characters (they
    would reach the logs and the listings as they are). BAD_REQUEST saying what is wrong."""
    if not isinstance(client_id, str) or not 1 <= len(client_id) <= CLIENT_ID_MAX:
        raise ProtocolError(ErrorCode.BAD_REQUEST,
                            f"client_id must be a string of 1-{CLIENT_ID_MAX} characters")
    bad = _CONTROL.search(client_id)
    if bad is not None:
        raise ProtocolError(ErrorCode.BAD_REQUEST,
                            f"client_id must not contain control characters, found "
                            f"{bad.group()!r} at {bad.start()}")
    return client_id


def validate_group_name(group: str) -> str:
    if not isinstance(group, str) or not GROUP_NAME_RE.match(group):
        raise ProtocolError(
            ErrorCode.BAD_REQUEST,
            f"group name {group!r} must match {GROUP_NAME_RE.pattern} (1-127 characters)",
        )
    return group
