"""Signed requests (docs/api.md, "Authentication"): the exact bytes both sides sign.

REST (``TIDEMQ-HMAC-SHA256``): the string to sign is six lines joined by ``\\n``::

    TIDEMQ-HMAC-SHA256
    <x-tidemq-date>           20261126T191334Z (UTC, ISO 8601 basic)
    <METHOD>                  upper case
    <canonical path>          percent-decoded, then encoded (RFC 3986 unreserved and / kept)
    <canonical query>         names and values decoded then encoded, pairs sorted, joined by &
    <hex SHA-256 of the body> of the bytes sent (of b"" without a body)

and the signature is the hex HMAC-SHA256 of it, keyed by the secret key. The request carries
``X-Tidemq-Date`` and ``Authorization: TIDEMQ-HMAC-SHA256 Credential=<access key>,
Signature=<hex>``. A date more than ``SIGNATURE_WINDOW_S`` away from the server's clock is refused
(replay window).

gRPC (RocketMQ 5, what the official clients send): ``authorization: MQv2-HMAC-SHA1
Credential=<ak>, SignedHeaders=x-mq-date-time, Signature=<hex HMAC-SHA1 of the x-mq-date-time
value>``.

Pure functions, no I/O: the SDK signs with them and the services verify with them.
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import re
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from urllib.parse import quote, unquote, unquote_plus

REST_SCHEME = "TIDEMQ-HMAC-SHA256"
GRPC_SCHEME = "MQv2-HMAC-SHA1"
AUTHORIZATION_HEADER = "Authorization"
DATE_HEADER = "X-Tidemq-Date"
GRPC_DATE_HEADER = "x-mq-date-time"
DATE_FORMAT = "%Y%m%dT%H%M%SZ"  # both doors: UTC, ISO 8601 basic
SIGNATURE_WINDOW_S = 15 * 60  # a signed date this far from the server's clock is refused (s)
ACCESS_KEY_ENV = "TIDEMQ_ACCESS_KEY"
SECRET_KEY_ENV = "TIDEMQ_SECRET_KEY"
_UNRESERVED = "-_.~"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


class SignatureError(ValueError):
    """A malformed ``Authorization`` or date header (the message says which part)."""


_DATE_RE = re.compile(r"([0-9]{4})([0-9]{2})([0-9]{2})T([0-9]{2})([0-9]{2})([0-9]{2})Z")
_PLAIN_PATH = re.compile(r"[A-Za-z0-9/_.~-]*")
# the last date formatted / parsed: requests of one second share it (strptime is slow)
_formatted: tuple[int, str] = (-1, "")
_parsed: tuple[str, float] = ("", 0.0)


def format_date(when_s: float | None = None) -> str:
    """``when_s`` (Unix seconds, default now) as a signing date."""
    global _formatted
    second = int(time.time() if when_s is None else when_s)
    if _formatted[0] != second:
        _formatted = (second, datetime.fromtimestamp(second, UTC).strftime(DATE_FORMAT))
    return _formatted[1]


def parse_date(value: str) -> float:
    """A signing date as Unix seconds; ``SignatureError`` when it is not one."""
    global _parsed
    if _parsed[0] == value:
        return _parsed[1]
    match = _DATE_RE.fullmatch(value)
    try:
        if match is None:
            raise ValueError(value)
        y, mo, d, h, mi, sec = (int(g) for g in match.groups())
        datetime(y, mo, d, h, mi, sec)  # a real date and time (ValueError otherwise)
        when = calendar.timegm((y, mo, d, h, mi, sec, 0, 0, 0))
    except ValueError as exc:
        raise SignatureError(f"date {value[:40]!r} is not YYYYMMDDTHHMMSSZ (UTC)") from exc
    _parsed = (value, float(when))
    return float(when)


def canonical_path(path: str) -> str:
    if _PLAIN_PATH.fullmatch(path):  # nothing to decode or encode (the usual case)
        return path
    return quote(unquote(path), safe="/" + _UNRESERVED)


def canonical_query(pairs: Sequence[tuple[str, str]]) -> str:
    """Decoded (name, value) pairs, each encoded, sorted, joined by ``&``."""
    if not pairs:
        return ""
    encoded = sorted((quote(k, safe=_UNRESERVED), quote(v, safe=_UNRESERVED)) for k, v in pairs)
    return "&".join(f"{k}={v}" for k, v in encoded)


def query_pairs(query: str) -> list[tuple[str, str]]:
    """The decoded pairs of a raw query string (``+`` is a space, as in forms)."""
    out = []
    for part in query.split("&"):
        if not part:
            continue
        name, _, value = part.partition("=")
        out.append((unquote_plus(name), unquote_plus(value)))
    return out


def body_digest(body: bytes | None) -> str:
    return hashlib.sha256(body).hexdigest() if body else EMPTY_SHA256


def string_to_sign(date: str, method: str, path: str, query: str, digest: str) -> str:
    """The REST string to sign; ``path`` and ``query`` raw (as sent), ``digest`` hex."""
    return "\n".join((REST_SCHEME, date, method.upper(), canonical_path(path),
                      canonical_query(query_pairs(query)), digest))


def rest_signature(secret_key: str, text: str) -> str:
    return hmac.digest(secret_key.encode(), text.encode(), "sha256").hex()


def rest_authorization(access_key: str, signature: str) -> str:
    return f"{REST_SCHEME} Credential={access_key}, Signature={signature}"


def sign_rest(access_key: str, secret_key: str, method: str, path: str, query: str,
              body: bytes | None, when_s: float | None = None) -> dict[str, str]:
    """The headers that sign one REST request (``path`` and ``query`` as they will be sent)."""
    date = format_date(when_s)
    text = string_to_sign(date, method, path, query, body_digest(body))
    return {DATE_HEADER: date,
            AUTHORIZATION_HEADER: rest_authorization(access_key, rest_signature(secret_key, text))}


def grpc_signature(secret_key: str, date: str) -> str:
    return hmac.digest(secret_key.encode(), date.encode(), "sha1").hex()


def parse_authorization(value: str, scheme: str) -> tuple[str, str]:
    """(access key, signature) of an ``Authorization`` value of ``scheme``."""
    head, _, rest = value.strip().partition(" ")
    if head != scheme:
        raise SignatureError(f"authorization scheme must be {scheme}")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, sep, val = part.strip().partition("=")
        if sep:
            fields[name.strip()] = val.strip()
    credential, signature = fields.get("Credential", ""), fields.get("Signature", "")
    if not credential or not signature:
        raise SignatureError("authorization lacks Credential=<access key> or Signature=<hex>")
    return credential, signature


def fresh(date_s: float, now_s: float | None = None, window_s: float = SIGNATURE_WINDOW_S,
          ) -> bool:
    """Whether a signed date lies inside the replay window around now."""
    now = time.time() if now_s is None else now_s
    return abs(now - date_s) <= window_s
