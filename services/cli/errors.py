"""How a failed `tidemq` command ends: its exit status, and the one table from error codes to it.

Every failure the CLI reports carries a code: a REST/SDK error code (``tidemq.protocol.codes``,
the same ``code`` a service answers with), or one of the CLI's own (``USAGE``, ``CONFIG``,
``TOPIC_EXISTS``, ``TIMEOUT``). ``EXIT_CODES`` maps each to an exit status, so a script can
tell "fix your arguments" from "it is not there" from "refused" from "try again later":

====  ==============================================================================
0     success
1     failure of another kind (a partial failure, an internal server error)
2     usage: bad arguments, options, input or configuration file
3     not found: no such topic, message, transaction, broker or endpoint
4     refused: unauthorized, forbidden, or a conflict with the current state
5     unavailable: a service unreachable, busy, shutting down, or a timeout (retry later)
====  ==============================================================================

With ``--json`` an error is one JSON object on stderr, ``{"code": ..., "message": ...}``,
instead of a coloured line.
"""

from __future__ import annotations

import json
import re
import sys

from tidemq.protocol.codes import ErrorCode

EXIT_OK = 0
EXIT_FAILURE = 1  # anything not below: a partial failure, INTERNAL_ERROR, an unknown code
EXIT_USAGE = 2  # bad arguments, options, input or config file (click's own usage errors too)
EXIT_NOT_FOUND = 3  # the thing named does not exist
EXIT_REFUSED = 4  # not allowed, or conflicts with the current state
EXIT_UNAVAILABLE = 5  # cannot be answered now: unreachable, busy, timed out; retry later

#: The CLI's own codes, beside the REST ones.
USAGE = "USAGE"  # a command-line usage error (unknown option, missing argument)
CONFIG = "CONFIG"  # the configuration file or a setting is bad
TOPIC_EXISTS = "TOPIC_EXISTS"  # `topic create` of a topic that exists with other settings
TIMEOUT = "TIMEOUT"  # no answer within --timeout
FAILED = "FAILED"  # a failure without a more precise code
ENDPOINT_NOT_FOUND = "NOT_FOUND"  # a service answered that it has no such endpoint

#: Error code -> exit status: the one table (docs/operations.md "Exit statuses" shows it).
EXIT_CODES: dict[str, int] = {
    ErrorCode.BAD_REQUEST: EXIT_USAGE,
    ErrorCode.INVALID_TOPIC_NAME: EXIT_USAGE,
    ErrorCode.INVALID_DELAY: EXIT_USAGE,
    ErrorCode.INVALID_BODY_ENCODING: EXIT_USAGE,
    ErrorCode.OFFSET_OUT_OF_RANGE: EXIT_USAGE,
    ErrorCode.INVALID_RECEIPT_HANDLE: EXIT_USAGE,
    ErrorCode.MESSAGE_TOO_LARGE: EXIT_USAGE,
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: EXIT_USAGE,
    ErrorCode.URI_TOO_LONG: EXIT_USAGE,
    USAGE: EXIT_USAGE,
    CONFIG: EXIT_USAGE,
    ErrorCode.TOPIC_NOT_FOUND: EXIT_NOT_FOUND,
    ErrorCode.MESSAGE_NOT_FOUND: EXIT_NOT_FOUND,
    ErrorCode.TRANSACTION_NOT_FOUND: EXIT_NOT_FOUND,
    ErrorCode.BROKER_NOT_FOUND: EXIT_NOT_FOUND,
    ENDPOINT_NOT_FOUND: EXIT_NOT_FOUND,
    ErrorCode.UNAUTHORIZED: EXIT_REFUSED,
    ErrorCode.FORBIDDEN: EXIT_REFUSED,
    ErrorCode.FORBIDDEN_SYSTEM_TOPIC: EXIT_REFUSED,
    ErrorCode.TRANSACTIONS_DISABLED: EXIT_REFUSED,
    ErrorCode.TRANSACTION_ALREADY_ENDED: EXIT_REFUSED,
    ErrorCode.ALREADY_DELIVERED: EXIT_REFUSED,
    ErrorCode.AMBIGUOUS_MESSAGE_ID: EXIT_REFUSED,  # 409: the id is in several topics
    ErrorCode.QUEUES_NOT_EMPTY: EXIT_REFUSED,
    TOPIC_EXISTS: EXIT_REFUSED,
    ErrorCode.BROKER_BUSY: EXIT_UNAVAILABLE,
    ErrorCode.DISK_FULL: EXIT_UNAVAILABLE,
    ErrorCode.UNAVAILABLE: EXIT_UNAVAILABLE,
    ErrorCode.NOT_PRIMARY: EXIT_UNAVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: EXIT_UNAVAILABLE,
    TIMEOUT: EXIT_UNAVAILABLE,
    ErrorCode.INTERNAL_ERROR: EXIT_FAILURE,
    FAILED: EXIT_FAILURE,
}

#: The exit statuses as ``tidemq --help`` lists them.
EXIT_HELP = ("Exit status: 0 success; 1 other failure; 2 usage (bad arguments, input or config "
             "file); 3 not found; 4 refused (unauthorized, forbidden, conflict); 5 unavailable "
             "(unreachable, busy, timeout: retry later).")

# "CODE: message", the form every CLI error message has had since the first version.
_CODED = re.compile(r"^([A-Z][A-Z0-9_]*[A-Z0-9]): (.*)$", re.DOTALL)


def split_code(text: str) -> tuple[str, str]:
    """``"TOPIC_NOT_FOUND: no topic t"`` -> (``TOPIC_NOT_FOUND``, ``no topic t``); a text
    without a leading code -> (``FAILED``, the text)."""
    match = _CODED.match(text)
    return (match.group(1), match.group(2)) if match else (FAILED, text)


def exit_code_for(code: str) -> int:
    """The exit status of an error code; an ``HTTP_<status>`` code (a non-JSON error answer)
    by its HTTP status class."""
    if code in EXIT_CODES:
        return EXIT_CODES[code]
    if code.startswith("HTTP_") and code[5:].isdigit():
        status = int(code[5:])
        if status == 404:
            return EXIT_NOT_FOUND
        if status in (401, 403, 409):
            return EXIT_REFUSED
        if status in (502, 503, 504):
            return EXIT_UNAVAILABLE
        if 400 <= status < 500:
            return EXIT_USAGE
    return EXIT_FAILURE


def print_json_error(code: str, message: str) -> None:
    """One JSON object on stderr: ``{"code": ..., "message": ...}``."""
    sys.stderr.write(json.dumps({"code": code, "message": message}, ensure_ascii=False) + "\n")
    sys.stderr.flush()
