"""FastAPI app factory shared by every service: error shape, /healthz, /metrics, token guard,
offline /docs and the completed OpenAPI document (tidemq_server.common.openapi).

Errors always leave as ``{"code", "message"}`` with the status of the code (tidemq.protocol).
"""

from __future__ import annotations

import base64
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Annotated, Any

import orjson
from fastapi import Depends, FastAPI, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse as FastAPIJSONResponse
from fastapi.responses import PlainTextResponse, Response
from fastapi.security import APIKeyHeader
from prometheus_client import (
    CONTENT_TYPE_LATEST,
        CollectorRegistry,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from starlette.exceptions import HTTPException as StarletteHTTPException
from tidemq.protocol import ErrorCode, ProtocolError
from tidemq.protocol.codec import encode_payload, is_msgpack
from tidemq.protocol.records._compiled import COMPILED

from tidemq_server.common.auth import Gate
from tidemq_server.common.auth.rest import AclMiddleware, account_of
from tidemq_server.common.bodies import describe
from tidemq_server.common.constants import TOKEN_HEADER
from tidemq_server.common.docs import install_docs
from tidemq_server.common.lean import declared_query
from tidemq_server.common.openapi import Health, errors, finish_openapi

log = logging.getLogger(__name__)

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]
#: A service's health hook: why it cannot do its work (e.g. "store writer stopped: ..."), or None
#: when healthy. /healthz answers 503 UNAVAILABLE with that reason while it is not None.
HealthCheck = Callable[[], str | None]


def _json_default(obj: Any) -> Any:
    """What orjson does not write by itself: bytes travel as base64 text (msgpack keeps them
    raw); named tuples (the schedule rows of tidemq.protocol) are arrays, as in msgpack."""
    if isinstance(obj, bytes | bytearray | memoryview):
        return base64.b64encode(obj).decode("ascii")
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


class JSONResponse(FastAPIJSONResponse):
    """JSON rendered with orjson. Bytes become base64 text; a dict with non-string keys (e.g.
    queue ids) is written with string keys, as JSON requires (msgpack answers keep ints)."""

    def render(self, content: Any) -> bytes:
        try:
            return orjson.dumps(content, default=_json_default)
        except orjson.JSONEncodeError:  # rare: non-string keys; the option costs on every call
            return orjson.dumps(content, default=_json_default, option=orjson.OPT_NON_STR_KEYS)


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
    """Raise UNAUTHORIZED unless the request carries the cluster token (when one is set). A
    request signed by an account the ACL allowed (ACL on) needs no token."""
    if not token or account_of(request.scope) is not None:
        return
    given = request.headers.get(TOKEN_HEADER, "")
    if not hmac.compare_digest(given.encode(), token.encode()):
        raise ProtocolError(ErrorCode.UNAUTHORIZED,
                            f"internal endpoint: send the cluster token in {TOKEN_HEADER}")


#: The cluster token as the OpenAPI security scheme of internal endpoints (checked by
#: ``require_token``, so a missing header answers 401 in the API's error shape).
TOKEN_SCHEME = APIKeyHeader(name=TOKEN_HEADER, scheme_name="ClusterToken", auto_error=False,
                            description="the cluster's shared token (`tidemq up` generates "
                                        "one); internal endpoints answer 401 without it")


def token_guard(token_of: Callable[[Request], str]) -> Callable[..., Awaitable[None]]:
    """A dependency requiring the token ``token_of(request)`` (declared as ClusterToken)."""

    async def guard(request: Request,
                    _given: Annotated[str | None, Security(TOKEN_SCHEME)] = None) -> None:
        require_token(request, token_of(request))  # async: FastAPI runs a sync one in a thread

    return guard


def query_names(route: Any) -> frozenset[str] | None:
    """The query parameters ``route`` declares (its dependencies' too); None for a route
    FastAPI does not build (static files, the OpenAPI document)."""
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return None
    found = _QUERY_NAMES.get(id(route))
    if found is None:
        found = _QUERY_NAMES[id(route)] = declared_query(dependant)
    return found


_QUERY_NAMES: dict[int, frozenset[str]] = {}


async def refuse_unknown_query(request: Request) -> None:
    """400 BAD_REQUEST naming a query parameter the endpoint does not take (``?offest=0``
    would otherwise be ignored, as a misspelt body field is not). A coroutine, as every
    dependency here: FastAPI sends a plain function to its thread pool on every request."""
    if not request.query_params:
        return
    known = query_names(request.scope.get("route"))
    if known is None:
        return
    unknown = sorted(set(request.query_params.keys()) - known)
    if unknown:
        takes = ", ".join(sorted(known)) or "no query parameters"
        raise ProtocolError(ErrorCode.BAD_REQUEST,
                            f"{unknown[0]}: unknown query parameter; this endpoint takes {takes}")


def create_app(title: str, registry: CollectorRegistry, lifespan: Lifespan | None = None,
               version: str = "0.1.0", health: HealthCheck | None = None,
               gate: Gate | None = None, strict_query: bool = True) -> FastAPI:
    """A service's app; with ``gate`` (ACL on) every request but /healthz, /metrics and the docs
    must be signed and allowed (tidemq_server.common.auth.rest). With ``strict_query`` (every API)
    a query parameter the endpoint does not take is refused with 400."""
    app = FastAPI(title=title, version=version, lifespan=lifespan,
                  default_response_class=JSONResponse, docs_url=None, redoc_url=None,
                  dependencies=[Depends(refuse_unknown_query)] if strict_query else None)
    if gate is not None:
        app.add_middleware(AclMiddleware, gate=gate)
    install_docs(app)
    finish_openapi(app)
    _record_start(registry)

    @app.exception_handler(ProtocolError)
    async def _protocol_error(_: Request, exc: ProtocolError) -> Response:
        headers = {"Retry-After": "1"} if exc.code == ErrorCode.BROKER_BUSY else None
        return error_response(exc.code, exc.message, headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> Response:
        message = describe(exc, skip=("body",))
        return error_response(ErrorCode.BAD_REQUEST, message or "invalid request")

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

    @app.get("/healthz", tags=["ops"], response_model=Health, summary="Liveness",
             responses=errors(ErrorCode.UNAVAILABLE))
    async def healthz(request: Request) -> Response:
        """``{"status": "ok"}``, or 503 UNAVAILABLE saying why the service cannot do its work
        (e.g. the broker's store writer stopped on an error)."""
        problem = health() if health is not None else None
        if problem:
            return error_response(ErrorCode.UNAVAILABLE, problem)
        return reply(request, {"status": "ok"})

    @app.get("/metrics", tags=["ops"], response_class=PlainTextResponse,
             summary="Prometheus metrics (text format)")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


#: When the service started (Unix seconds): the console shows each service's uptime from it.
START_TIME_METRIC = "tidemq_service_start_time_seconds"
#: 1 when this process runs the compiled record core (tidemq.protocol.records._crecords), 0 when
#: the pure-Python one (not built, or TIDEMQ_PURE_PYTHON=1).
RECORD_CORE_METRIC = "tidemq_record_core_compiled"


def _record_start(registry: CollectorRegistry) -> None:
    """The start time, and the standard ``process_*`` / ``python_*`` collectors (CPU, memory,
    file descriptors, garbage collection) every Prometheus client library exports."""
    try:
        started = Gauge(START_TIME_METRIC, "When this service process started (Unix seconds)",
                        registry=registry)
    except ValueError:  # a second app on the same registry (tests): the first start stands
        return
    started.set(time.time())
    Gauge(RECORD_CORE_METRIC, "1: the compiled record core runs; 0: the pure-Python one",
          registry=registry).set(1 if COMPILED else 0)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)


