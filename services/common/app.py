"""FastAPI app factory shared by every service: error shape, /healthz, /metrics, token guard.

Errors always leave as ``{"code", "message"}`` with the status of the code (tidemq.protocol).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from tidemq.protocol import ErrorCode, ProtocolError
from tidemq.protocol.codec import encode_payload, is_msgpack

from services.common.constants import TOKEN_HEADER

log = logging.getLogger(__name__)

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]


class JSONResponse(Response):
    """JSON rendered with orjson (fast, and handles bytes-free payloads of any size)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def error_response(code: ErrorCode, message: str, headers: dict[str, str] | None = None,
                   ) -> JSONResponse:
    return JSONResponse({"code": code.value, "message": message},
                          status_code=code.http_status, headers=headers)


def reply(request: Request, payload: Any, status: int = 200) -> Response:
    """Answer in the encoding the client accepts (msgpack when it asked for it)."""
    accept = request.headers.get("accept") or request.headers.get("content-type")
    if is_msgpack(accept):
        return Response(encode_payload(payload, accept), status_code=status,
                        media_type="application/msgpack")
    return JSONResponse(payload, status_code=status)


def require_token(request: Request, token: str) -> None:
    """Raise UNAUTHORIZED unless the request carries the cluster token (when one is set)."""
    if not token:
        return
    given = request.headers.get(TOKEN_HEADER, "")
    if not hmac.compare_digest(given.encode(), token.encode()):
        raise ProtocolError(ErrorCode.UNAUTHORIZED,
                            f"internal endpoint: send the cluster token in {TOKEN_HEADER}")


def create_app(title: str, registry: CollectorRegistry, lifespan: Lifespan | None = None,
               version: str = "0.1.0") -> FastAPI:
    app = FastAPI(title=title, version=version, lifespan=lifespan,
                  default_response_class=JSONResponse)

    @app.exception_handler(ProtocolError)
    async def _protocol_error(_: Request, exc: ProtocolError) -> Response:
        headers = {"Retry-After": "1"} if exc.code == ErrorCode.BROKER_BUSY else None
        return error_response(exc.code, exc.message, headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> Response:
        parts = []
        for err in exc.errors()[:5]:
            where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
            parts.append(f"{where or 'body'}: {err.get('msg')}")
        return error_response(ErrorCode.BAD_REQUEST, "; ".join(parts) or "invalid request")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            return JSONResponse({"code": "NOT_FOUND", "message": "no such endpoint"}, 404)
        if exc.status_code == 405:
            return JSONResponse({"code": "METHOD_NOT_ALLOWED",
                                   "message": "method not allowed on this path"}, 405)
        return JSONResponse({"code": "BAD_REQUEST", "message": str(exc.detail)},
                              exc.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> Response:
        log.exception("unhandled error: %s", exc)
        return error_response(ErrorCode.INTERNAL_ERROR, f"internal error: {type(exc).__name__}")

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics", tags=["ops"])
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


async def no_lifespan(_: FastAPI) -> AsyncIterator[None]:
    yield
