"""Log lines of every service and of `tidemq up`: readable text (the default) or JSON.

``TIDEMQ_LOG_FORMAT=json`` makes every line one JSON object::

    {"time": "2026-11-28T06:19:54.123Z", "level": "INFO", "service": "broker",
     "logger": "tidemq_server.broker.service", "message": "...", "request_id": "...",
     "message_id": "..."}

``time`` is ISO 8601 in UTC (milliseconds); ``request_id`` (the request's ``X-Request-Id``, or
one made up) and ``message_id`` (a send of one message; ``message_ids`` for a batch) are there
when a line is logged while a request carrying them is handled; a traceback is the string field
``exc_info``. The ids are kept in context variables that only a JSON-logging process sets
(``ids_wanted``), so text logging pays nothing for them on the send path.

A text line escapes control characters in the message, so a client's string cannot forge a
line; a JSON line is one line by construction.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import uuid
from collections.abc import Mapping
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from tidemq_server.common.constants import (
    LOG_FORMAT_ENV,
    LOG_FORMATS,
    LOG_LEVELS,
    REQUEST_ID_HEADER,
)

TEXT_FORMAT = "%(asctime)s %(levelname)-5s %(name)s: %(message)s"
MAX_LOGGED_IDS = 20  # message ids of a batch shown in one JSON line at most

#: The id of the request being handled (JSON logs only).
request_id: ContextVar[str | None] = ContextVar("tidemq_request_id", default=None)
#: The ids of the messages a request sends (JSON logs only).
message_ids: ContextVar[tuple[str, ...]] = ContextVar("tidemq_message_ids", default=())

_ids_wanted = False  # True once JSON logging is set up: request handling then sets the ids

#: What a log line must not carry as is: C0 controls but tab (a newline would forge a line, a
#: NUL makes grep call the file binary), DEL, C1 and the Unicode line separators.
_UNSAFE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")


def _escaped(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


class EscapingFormatter(logging.Formatter):
    """Every message leaves as one line: control characters in it (a client's id, a topic
    name, any string a request carried) are written escaped (``\\n``, ``\\x00``). A traceback
    appended to the message keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = _UNSAFE.sub(_escaped, record.message)
        return super().formatMessage(record)


class JsonFormatter(logging.Formatter):
    """One JSON object a line (the module docstring lists the fields)."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "service": self.service,
            "logger": record.name,
            "message": record.getMessage(),
        }
        rid = request_id.get()
        if rid is not None:
            line["request_id"] = rid
        mids = message_ids.get()
        if len(mids) == 1:
            line["message_id"] = mids[0]
        elif mids:
            line["message_ids"] = list(mids[:MAX_LOGGED_IDS])
        fields = getattr(record, "fields", None)  # logger.info(..., extra={"fields": {...}})
        if isinstance(fields, dict):
            line.update((k, v) for k, v in fields.items() if k not in line)
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc_info"] = record.exc_text
        if record.stack_info:
            line["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def check_level(value: object) -> str:
    """A log level name, lower case (ValueError naming the accepted ones)."""
    level = str(value).strip().lower()
    if level not in LOG_LEVELS:
        raise ValueError(f"unknown log level {value!r}: use one of {', '.join(LOG_LEVELS)}")
    return level


def check_format(value: object) -> str:
    """A log format name, lower case (ValueError naming the accepted ones)."""
    fmt = str(value).strip().lower()
    if fmt not in LOG_FORMATS:
        raise ValueError(f"unknown log format {value!r}: use one of {', '.join(LOG_FORMATS)}")
    return fmt


def format_from_env(env: Mapping[str, str]) -> str:
    """``TIDEMQ_LOG_FORMAT`` (text when unset; ValueError naming the variable when bad)."""
    try:
        return check_format(env.get(LOG_FORMAT_ENV) or "text")
    except ValueError as exc:
        raise ValueError(f"{LOG_FORMAT_ENV}: {exc}") from None


def setup_logging(level: str = "info", fmt: str = "text", service: str = "tidemq") -> None:
    """Log to stderr at ``level`` in ``fmt`` (text or json) for every logger of the process."""
    global _ids_wanted
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(service))
    else:
        handler.setFormatter(EscapingFormatter(TEXT_FORMAT))
    _ids_wanted = fmt == "json"
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)


def ids_wanted() -> bool:
    """True when log lines show ids: request handling sets ``request_id`` / ``message_ids``."""
    return _ids_wanted


def note_message_ids(ids: list[str]) -> None:
    """The ids of the messages being sent, for the log lines that follow (JSON logs only)."""
    if _ids_wanted:
        message_ids.set(tuple(ids))


class RequestIds:
    """ASGI middleware (JSON logs only): each request's log lines carry its ``request_id``,
    the ``X-Request-Id`` header's value (at most 64 characters) or a new random one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = ""
        wanted = REQUEST_ID_HEADER.lower().encode("latin-1")
        for name, value in scope.get("headers", ()):
            if name == wanted:
                given = value.decode("latin-1").strip()[:64]
                break
        token = request_id.set(given or uuid.uuid4().hex[:16])
        sent = message_ids.set(())
        try:
            await self.app(scope, receive, send)
        finally:
            message_ids.reset(sent)
            request_id.reset(token)
