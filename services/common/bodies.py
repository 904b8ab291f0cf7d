"""Request bodies of every service, read by hand in JSON or msgpack, and their documentation.

Routes read bodies themselves rather than through FastAPI so that msgpack works on every
endpoint and the send hot path skips pydantic; ``body_doc`` still publishes each body's schema
in /docs. A body without a content type, of another media type or naming a charset other than
UTF-8 is 415 UNSUPPORTED_MEDIA_TYPE (``request_is_msgpack``); a field the model does
not know is 400 BAD_REQUEST naming it (models set ``extra="forbid"``; bodies parsed by hand
call ``tidemq.protocol.message.reject_unknown``).
"""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.requests import ClientDisconnect
from tidemq.protocol import CONTENT_JSON, CONTENT_MSGPACK, ErrorCode, ProtocolError, decode_payload
from tidemq.protocol.codec import request_is_msgpack

M = TypeVar("M", bound=BaseModel)

MAX_ADMIN_BODY = 4 * 1024 * 1024  # bytes of a request body that carries no messages


class StrictBody(BaseModel):
    """Base of request bodies: a field not declared here is refused (400 naming it)."""

    model_config = ConfigDict(extra="forbid")


def too_large(size: int, limit: int) -> ProtocolError:
    return ProtocolError(ErrorCode.MESSAGE_TOO_LARGE,
                         f"request body of {size} bytes or more exceeds {limit} bytes")


async def read_payload(request: Request, limit: int = MAX_ADMIN_BODY) -> Any:
    """The decoded body (JSON or msgpack); 413 MESSAGE_TOO_LARGE past ``limit`` bytes, checked
    before the body is held in memory; 415 for a body without a content type, of any other
    media type or in a charset other than UTF-8."""
    raw = await read_raw(request, limit)
    content_type = request.headers.get("content-type")
    if raw:
        request_is_msgpack(content_type)
    return decode_payload(raw, content_type)


async def read_raw(request: Request, limit: int) -> bytes:
    """The body's bytes as they came; 413 MESSAGE_TOO_LARGE past ``limit`` bytes, checked
    before the body is held in memory."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise too_large(int(declared), limit)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large(size, limit)
            chunks.append(chunk)
    except ClientDisconnect:  # nobody reads the answer: a client error, not a 500 and a traceback
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"the client went away after {size} bytes "
                            "of the request body") from None
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def read_model(request: Request, model: type[M]) -> M:
    """The request body (JSON or msgpack) validated as ``model``; 400 BAD_REQUEST if not."""
    payload = await read_payload(request)
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise ProtocolError(ErrorCode.BAD_REQUEST, describe(exc)) from None


def describe(exc: ValidationError | RequestValidationError, skip: tuple[str, ...] = ()) -> str:
    """The first few validation errors, each naming its field (``skip``: location prefixes
    that name no field, such as FastAPI's ``body``/``query``)."""
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()) if p not in skip) or "body"
        if err.get("type") == "extra_forbidden":
            parts.append(f"unknown field {where!r}: not part of this request")
        else:
            parts.append(f"{where}: {err.get('msg')}")
    return "; ".join(parts)


def body_doc(model: type[BaseModel], description: str = "") -> dict[str, Any]:
    """``openapi_extra`` documenting a body read by hand, in JSON and msgpack."""
    schema = inline_schema(model.model_json_schema())
    content = {CONTENT_JSON: {"schema": schema}, CONTENT_MSGPACK: {"schema": schema}}
    body: dict[str, Any] = {"required": True, "content": content}
    if description:
        body["description"] = description
    return {"requestBody": body}


def inline_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Replace pydantic's local ``$defs`` references by their definitions (no recursion here)."""
    defs = schema.pop("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return walk(dict(defs[ref.rsplit("/", 1)[-1]]))
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    result: dict[str, Any] = walk(schema)
    return result
