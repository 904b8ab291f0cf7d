"""Request and response bodies: JSON (orjson) or msgpack, chosen by content type."""

from __future__ import annotations

from typing import Any, cast

import msgpack
import orjson

from tidemq.protocol.batch import CONTENT_BATCH
from tidemq.protocol.codes import ErrorCode, ProtocolError

CONTENT_JSON = "application/json"
CONTENT_MSGPACK = "application/msgpack"


#: Media types a request body may have; a body without a content type is read as JSON.
JSON_TYPES = frozenset({CONTENT_JSON})
MSGPACK_TYPES = frozenset({CONTENT_MSGPACK, "application/x-msgpack"})


def is_batch(content_type: str | None) -> bool:
    """Whether a request body is record format v2 batches (``CONTENT_BATCH``)."""
    if not content_type:
        return False
    return content_type.partition(";")[0].strip().lower() == CONTENT_BATCH


def is_msgpack(content_type: str | None) -> bool:
    return bool(content_type) and "msgpack" in content_type  # type: ignore[operator]


def request_is_msgpack(content_type: str | None) -> bool:
    """Whether a request body is msgpack (else JSON); 415 UNSUPPORTED_MEDIA_TYPE for a body
    of any other media type (parameters such as ``charset`` are ignored)."""
    if not content_type:
        return False
    media = content_type.partition(";")[0].strip().lower()
    if media in JSON_TYPES:
        return False
    if media in MSGPACK_TYPES:
        return True
    raise ProtocolError(ErrorCode.UNSUPPORTED_MEDIA_TYPE,
                        f"content type {media!r} is not supported: send the body as "
                        f"{CONTENT_JSON} or {CONTENT_MSGPACK}")


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
