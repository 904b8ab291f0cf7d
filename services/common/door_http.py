"""The lean door in the HTTP/1.1 protocol (option (a) of issue 33): a hot request never enters
the FastAPI app.

``lean_protocol(app)`` is the server protocol (``JsonErrorsProtocol``: uvicorn's httptools
protocol, so framing, keep-alive, pipelining, chunked bodies, ``Expect: 100-continue``, flow
control and TLS stay the server's own). When a request's head is complete it asks the
``LeanTable`` (tidemq_server.common.door) whether a hot route serves it with plain parameters;
if so the request runs through the lean stack — the app's error handler
(``ServerErrorMiddleware``), the app's own middlewares (raw id paths, ACL, request ids: the same
classes, so the same checks and answers) and the endpoint — instead of the app. Every other
request, and every request while FastAPI's OpenTelemetry support is on (it wraps the app), goes
to the app as before.
"""

from __future__ import annotations

import time
from typing import Any

import httptools
from fastapi import FastAPI
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.requests import Request

from tidemq_server.common.constants import LEAN_TELEMETRY_CHECK_S
from tidemq_server.common.door import (
    ASGIApp,
    Hot,
    LeanTable,
    Scope,
    answer,
    forwarded,
    plain_params,
)
from tidemq_server.common.httpserver import JsonErrorsProtocol

LEAN_SCOPE_KEY = "tidemq.lean"  # the scope's hot route and parameters, for the lean core


class LeanDoor:
    """The lean stack of one app, and the choice between it and the app."""

    def __init__(self, app: FastAPI) -> None:
        self.fastapi = app
        self.table = LeanTable(app)
        self._stack: ASGIApp | None = None
        self._telemetry = False
        self._telemetry_next = 0.0  # time.monotonic() of the next telemetry_on question

    @property
    def stack(self) -> ASGIApp:
        """ServerErrorMiddleware → the app's middlewares → the endpoint (built once the app's
        middlewares are final, at the first hot request)."""
        if self._stack is None:
            app: ASGIApp = self._core
            for middleware in reversed(self.fastapi.user_middleware):
                app = middleware.cls(app, *middleware.args, **middleware.kwargs)
            handler = self.fastapi.exception_handlers.get(Exception)
            self._stack = ServerErrorMiddleware(app, handler=handler)
        return self._stack

    def telemetry_on(self) -> bool:
        """Whether FastAPI's OpenTelemetry support is on (asked at most every
        ``LEAN_TELEMETRY_CHECK_S``: the question costs a few per cent of a lean request)."""
        now = time.monotonic()
        if now >= self._telemetry_next:
            native = getattr(self.fastapi, "_native_telemetry", None)
            self._telemetry = bool(native is not None and native.enabled())
            self._telemetry_next = now + LEAN_TELEMETRY_CHECK_S
        return self._telemetry

    def take(self, scope: Scope, method: bytes, url: bytes,
             headers: list[tuple[bytes, bytes]]) -> bool:
        """Whether the lean stack serves this request; if so ``scope`` is completed as the
        server would (path, raw path, query) plus the app, path and lean parameters."""
        parsed = httptools.parse_url(url)
        raw_path: bytes = parsed.path
        if b"%" in raw_path or forwarded(headers):
            return False
        path = raw_path.decode("ascii")
        found = self.table.find(method.decode("ascii"), path)
        if found is None or self.telemetry_on():
            return False
        hot, path_params = found
        probe: Scope = {"type": "http", "query_string": parsed.query or b"",
                        "path_params": path_params, "headers": headers}
        params = plain_params(hot, Request(probe))
        if params is None:
            return False
        scope.update(probe)
        scope["app"] = self.fastapi
        scope[LEAN_SCOPE_KEY] = (hot, params)
        return True

    async def _core(self, scope: Scope, receive: Any, send: Any) -> None:
        hot: Hot
        hot, params = scope[LEAN_SCOPE_KEY]
        request = Request(scope, receive, send)
        response = await answer(self.fastapi, hot, request, params)
        await response(scope, receive, send)


def lean_protocol(app: FastAPI) -> type[JsonErrorsProtocol]:
    """The server protocol serving ``app``'s hot routes through its ``LeanDoor``."""
    door = LeanDoor(app)

    class LeanProtocol(JsonErrorsProtocol):
        def on_headers_complete(self) -> None:
            method = self.parser.get_method()
            if (self.parser.should_upgrade() or self.limit_concurrency is not None
                    or not door.take(self.scope, method, self.url,  # type: ignore[arg-type]
                                  self.headers)):
                super().on_headers_complete()
                return
            full, self.app = self.app, door.stack
            try:
                super().on_headers_complete()
            finally:
                self.app = full

    return LeanProtocol

