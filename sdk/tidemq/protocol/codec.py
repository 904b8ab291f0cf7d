"""Request and response bodies: JSON (orjson) or msgpack, chosen by content type."""

from __future__ import annotations

from typing import Any, cast

import msgpack
import orjson

from tidemq.protocol.codes import ErrorCode, ProtocolError
from tidemq.protocol.records.v2 import CONTENT_BATCH

CONTENT_JSON = "application/json"
CONTENT_MSGPACK = "application/msgpack"


#: Media types a request body may have (a body without a content type is refused: 415).
JSON_TYPES = frozenset({CONTENT_JSON})
MSGPACK_TYPES = frozenset({CONTENT_MSGPACK, "application/x-msgpack"})
#: The one charset a request body may name (JSON is UTF-8, RFC 8259); none named means it too.
UTF8_NAMES = frozenset({"utf-8", "utf8"})


def is_batch(content_type: str | None) -> bool:
    """Whether a request body is record format v2 batches (``CONTENT_BATCH``)."""
    if not content_type:
        return False
    return content_type.partition(";")[0].strip().lower() == CONTENT_BATCH


def is_msgpack(content_type: str | None) -> bool:
    return bool(content_type) and "msgpack" in content_type  # type: ignore[operator]


def request_is_msgpack(content_type: str | None) -> bool:
    """Whether a request body is msgpack (else JSON). 415 UNSUPPORTED_MEDIA_TYPE for a body
    without a content type, of any other media type, or naming a charset other than UTF-8."""
    accepted = f"send the body as {CONTENT_JSON} or {CONTENT_MSGPACK}"
    if not content_type or not content_type.strip():
        raise ProtocolError(ErrorCode.UNSUPPORTED_MEDIA_TYPE,
                            f"the request body has no content-type: {accepted}")
    media, _, params = content_type.partition(";")
    media = media.strip().lower()
    if media in JSON_TYPES:
        binary = False
    elif media in MSGPACK_TYPES:
        binary = True
    else:
        raise ProtocolError(ErrorCode.UNSUPPORTED_MEDIA_TYPE,
                            f"content type {media!r} is not supported: {accepted}")
    charset = media_parameter(params, "charset")
    if charset is not None and charset.lower() not in UTF8_NAMES:
        raise ProtocolError(ErrorCode.UNSUPPORTED_MEDIA_TYPE,
                            f"charset {charset!r} is not supported: bodies are UTF-8; send "
                            f"{media}; charset=utf-8 (or no charset)")
    return binary


def media_parameter(params: str, name: str) -> str | None:
    """The value of the parameter ``name`` in the ``;``-separated parameters of a media type
    (quotes removed), None when absent."""
    for item in params.split(";"):
        key, sep, value = item.partition("=")
        if sep and key.strip().lower() == name:
            return value.strip().strip('"')
    return None


def decode_payload(raw: bytes, content_type: str | None) -> Any:
    """Decode a request or response body; a malformed one is a BAD_REQUEST."""
    try:
        if is_msgpack(content_type):
            return msgpack.unpackb(raw, raw=False)
        return orjson.loads(raw) if raw else {}
    except (ValueError, msgpack.UnpackException, TypeError) as exc:
        kind = "msgpack" if is_msgpack(content_type) else "JSON"
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"body is not valid {kind}: {exc}") from exc


def encode_payload(obj: Any, content_type: str | None) -> bytes:
    if is_msgpack(content_type):
        return cast(bytes, msgpack.packb(obj, use_bin_type=True))
    return orjson.dumps(obj)
