"""msgpack for schemathesis: request bodies it generates, and answers it validates.

Importing this module registers both. A msgpack answer is checked as its JSON twin: raw bytes
stand where the document declares a string (JSON carries them as base64 text) and maps keyed by
integers get string keys, as JSON has them.
"""

from __future__ import annotations

from typing import Any

import msgpack
import schemathesis
from tidemq.protocol import CONTENT_MSGPACK


@schemathesis.serializer(CONTENT_MSGPACK)
def to_msgpack(_ctx: schemathesis.SerializationContext, value: Any) -> bytes:
    packed: bytes = msgpack.packb(packable(value), use_bin_type=True)
    return packed


@schemathesis.deserializer(CONTENT_MSGPACK)
def from_msgpack(_ctx: schemathesis.DeserializationContext, response: Any) -> Any:
    return as_json(msgpack.unpackb(response.content, raw=False, strict_map_key=False))


def packable(value: Any) -> Any:
    """A generated body as msgpack can carry it: integers beyond 64 bits become floats."""
    if isinstance(value, int) and not isinstance(value, bool) and \
            not -(2**63) <= value < 2**64:
        return float(value)
    if isinstance(value, dict):
        return {k: packable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [packable(v) for v in value]
    return value


def as_json(value: Any) -> Any:
    """A decoded msgpack answer with the shapes JSON would give it."""
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if isinstance(value, dict):
        return {str(k): as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_json(v) for v in value]
    return value
