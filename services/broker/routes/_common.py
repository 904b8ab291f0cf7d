"""What every broker route shares: reaching the Broker, reading bodies in JSON or msgpack.

Bodies are read by hand rather than by FastAPI so that msgpack works on every endpoint and the
send hot path skips pydantic; ``body_doc`` still publishes each body's schema in /docs.
"""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from tidemq.protocol import CONTENT_JSON, CONTENT_MSGPACK, ErrorCode, ProtocolError, decode_payload

from services.broker.messaging.convert import born_host
from services.broker.service import Broker

M = TypeVar("M", bound=BaseModel)


def broker_of(request: Request) -> Broker:
    broker: Broker = request.app.state.broker
    return broker


def wants_msgpack(request: Request) -> bool:
    """True when the answer goes out as msgpack (so message bodies stay raw bytes)."""
    accept = request.headers.get("accept") or request.headers.get("content-type") or ""
    return "msgpack" in accept


def client_host(request: Request) -> str:
    client = request.client
    return born_host(client.host, client.port) if client else born_host(None, None)


MAX_ADMIN_BODY = 4 * 1024 * 1024  # bytes of a request body that carries no messages


def too_large(size: int, limit: int) -> ProtocolError:
    return ProtocolError(ErrorCode.MESSAGE_TOO_LARGE,
                         f"request body of {size} bytes or more exceeds {limit} bytes")


async def read_payload(request: Request, limit: int = MAX_ADMIN_BODY) -> Any:
    """The decoded body (JSON or msgpack); 413 MESSAGE_TOO_LARGE past ``limit`` bytes, checked
    before the body is held in memory."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise too_large(int(declared), limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(size, limit)
        chunks.append(chunk)
    return decode_payload(b"".join(chunks), request.headers.get("content-type"))


async def read_model(request: Request, model: type[M]) -> M:
    """The request body (JSON or msgpack) validated as ``model``; 400 BAD_REQUEST if not."""
    payload = await read_payload(request)
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise ProtocolError(ErrorCode.BAD_REQUEST, describe(exc)) from None


def describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err.get("loc", ())) or "body"
        parts.append(f"{where}: {err.get('msg')}")
    return "; ".join(parts)


def body_doc(model: type[BaseModel], description: str = "") -> dict[str, Any]:
    """``openapi_extra`` documenting a body read by hand, in JSON and msgpack."""
    schema = _inline(model.model_json_schema())
    content = {CONTENT_JSON: {"schema": schema}, CONTENT_MSGPACK: {"schema": schema}}
    body: dict[str, Any] = {"required": True, "content": content}
    if description:
        body["description"] = description
    return {"requestBody": body}


def _inline(schema: dict[str, Any]) -> dict[str, Any]:
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
