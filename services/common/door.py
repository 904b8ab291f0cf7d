"""The lean door: the hot routes served without Starlette's middleware, routing and FastAPI's
parameter solving, by the same endpoint functions the app documents and serves.

A hot route is an endpoint marked ``@lean(parse)`` on a ``LeanRoute`` router
(tidemq_server.common.lean): send, batch send, both pulls, transaction halves and ends, acks,
heartbeats. ``LeanTable`` finds them in the app's routes, in the app's order; ``serve`` calls the
endpoint with a plain Starlette ``Request`` and answers what it returns, or what the app's own
exception handler answers for its ``ProtocolError``. A request the table does not take for sure
(another route would match first, an unknown query parameter, a parameter ``parse`` does not read
plainly, a percent-encoded or forwarded request) is ``None``: it goes the app's whole way, so
every answer keeps exactly its shape (tests/broker/routes/test_lean_door.py compares them byte
for byte).

Two doors use the table (issue 33 measured both, bench/door.py): ``LeanProtocol`` in
tidemq_server.common.door_http (the HTTP/1.1 protocol serves them itself: the default) and
``LeanMiddleware`` here (an ASGI middleware inside the app: kept for the measurement).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response
from tidemq.protocol import ProtocolError

from tidemq_server.common.lean import PARSE_ATTR, Parse, declared_query

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]
#: What ``serve`` hands back for the door to write.
Endpoint = Callable[..., Awaitable[Response]]

#: Headers that make the ASGI server rewrite the request's client (uvicorn's proxy headers):
#: such a request goes the app's whole way.
FORWARDED = (b"x-forwarded-for", b"x-forwarded-proto")


@dataclass(frozen=True, slots=True)
class Hot:
    """One hot route: its endpoint, ``parse``, the query names it takes, the regex of its path
    and the routes before it that could take the same request."""

    endpoint: Endpoint
    parse: Parse
    known: frozenset[str]
    regex: re.Pattern[str]
    shadows: tuple[re.Pattern[str], ...]


def flat_routes(routes: list[Any]) -> Iterator[Any]:
    """The app's routes in matching order, included routers expanded (FastAPI keeps an
    included router as one entry whose routes carry the include's prefix and dependencies)."""
    for route in routes:
        contexts = getattr(route, "effective_route_contexts", None)
        if contexts is None:
            yield route
        else:
            yield from contexts()


class LeanTable:
    """The hot routes of ``app``, per method (read once, at the first request)."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self._by_method: dict[str, list[Hot]] | None = None

    def _build(self) -> dict[str, list[Hot]]:
        table: dict[str, list[Hot]] = {}
        earlier: list[tuple[frozenset[str] | None, re.Pattern[str]]] = []
        for route in flat_routes(self.app.routes):
            regex = getattr(route, "path_regex", None)
            methods = getattr(route, "methods", None)
            endpoint = getattr(route, "endpoint", None)
            parse = getattr(endpoint, PARSE_ATTR, None)
            if endpoint is not None and parse is not None and methods and regex is not None:
                known = declared_query(route.dependant)
                for method in methods:
                    shadows = tuple(r for m, r in earlier if m is None or method in m)
                    table.setdefault(method, []).append(Hot(
                        endpoint, parse, known, regex, shadows))
            if regex is not None:
                earlier.append((frozenset(methods) if methods else None, regex))
            else:  # a mount or anything else without a path regex: it may take any path
                earlier.append((None, re.compile("")))
        return table

    def find(self, method: str, path: str) -> tuple[Hot, dict[str, str]] | None:
        """The hot route serving ``method path`` (a decoded path without ``%``), or None."""
        by_method = self._by_method
        if by_method is None:
            by_method = self._by_method = self._build()
        for hot in by_method.get(method, ()):
            match = hot.regex.match(path)
            if match is None:
                continue
            if any(s.match(path) for s in hot.shadows):
                return None
            return hot, match.groupdict()
        return None


def plain_params(hot: Hot, request: Request) -> dict[str, Any] | None:
    """The endpoint's parameters when every one is plain (``parse``) and no query parameter is
    unknown; None: the app's whole way answers this request."""
    if request.query_params.keys() - hot.known:
        return None
    return hot.parse(request)


async def answer(app: FastAPI, hot: Hot, request: Request, params: dict[str, Any]) -> Response:
    """The endpoint's answer, or the app's own answer to its ``ProtocolError``."""
    try:
        return await hot.endpoint(request=request, **params)
    except ProtocolError as exc:
        handler: Any = app.exception_handlers[ProtocolError]
        refused: Response = await handler(request, exc)
        return refused


def forwarded(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(name in FORWARDED for name, _ in headers)


class LeanMiddleware:
    """The hot routes as an ASGI middleware inside the app (option (b) of issue 33): the
    server, ``ServerErrorMiddleware`` and the outer middlewares (ACL, request ids, raw id
    paths) stay; routing, the inner middlewares and FastAPI's handler are skipped."""

    def __init__(self, app: ASGIApp, fastapi: FastAPI) -> None:
        self.app = app
        self.fastapi = fastapi
        self.table = LeanTable(fastapi)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and b"%" not in scope.get("raw_path", b"%"):
            found = self.table.find(scope["method"], scope["path"])
            if found is not None:
                hot, scope["path_params"] = found
                request = Request(scope, receive, send)
                params = plain_params(hot, request)
                if params is not None:
                    response = await answer(self.fastapi, hot, request, params)
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)
