"""What `tidemq up` says while it runs: coloured lines, or JSON log lines like its services'.

With ``TIDEMQ_LOG_FORMAT=json`` (services/common/logs.py) every notice of the supervisor (ready,
exited, restarting, stopping, the endpoints) is one JSON object a line on stderr, with
``service`` ``up`` and logger ``tidemq.up``; its children log JSON too (they inherit the
variable). Otherwise notices are rich text, as always.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from rich.text import Text

from tidemq_server.cli.rest import console, err_console
from tidemq_server.common.logs import JsonFormatter, setup_logging

LOGGER = "tidemq.up"

_log: logging.Logger | None = None  # set by use_json()


def use_json() -> None:
    """From now on notices are JSON log lines on stderr."""
    global _log
    setup_logging("info", "json", "up")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per health probe
    _log = logging.getLogger(LOGGER)


def use_text() -> None:
    """Back to rich text (tests run several `up`s in one process)."""
    global _log
    _log = None


def json_on() -> bool:
    return _log is not None


def say(text: str, *, level: int = logging.INFO, err: bool = False, markup: bool = True,
        fields: dict[str, Any] | None = None, **rich: Any) -> None:
    """One notice: ``text`` (rich markup unless ``markup=False``) printed on stdout (stderr
    with ``err``), or logged at ``level`` as JSON with ``fields`` added to the line."""
    if _log is not None:
        plain = Text.from_markup(text).plain if markup else text
        _log.log(level, plain, extra={"fields": fields} if fields else None)
        return
    (err_console if err else console).print(text, markup=markup, **rich)


def status(text: str) -> contextlib.AbstractContextManager[Any]:
    """A spinner while waiting (nothing in JSON mode)."""
    if _log is not None:
        return contextlib.nullcontext()
    return console.status(text, spinner="dots")


def banner(text: str) -> str:
    """The line opening a child's run in its log file: a JSON line in JSON mode."""
    if _log is not None:
        record = logging.LogRecord(LOGGER, logging.INFO, __file__, 0, text, None, None)
        return JsonFormatter("up").format(record) + "\n"
    return f"\n=== {text} at {time.ctime()} ===\n"
