"""Request and response bodies: JSON (orjson) or msgpack, chosen by content type."""

from __future__ import annotations

from typing import Any, cast

import msgpack
import orjson

from tidemq.protocol.codes import ErrorCode, ProtocolError

CONTENT_JSON = "application/json"
CONTENT_MSGPACK = "application/msgpack"


def is_msgpack(content_type: str | None) -> bool:
    return bool(content_type) and "msgpack" in content_type  # type: ignore[operator]


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
