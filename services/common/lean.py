"""Hot routes without FastAPI's per-request parameter machinery, documented as before.

A FastAPI route solves its dependencies (pydantic validation of every path and query parameter,
a dict of values, the response-model checks) on each request; the profile put that at several
per cent of the broker on the send and pull paths. ``LeanRoute`` keeps the endpoint, its
signature and therefore its OpenAPI description unchanged, but serves a request by calling the
endpoint directly with the parameters a ``parse`` function read by hand from the request.

``parse`` accepts only the plain, valid forms (``123``, not ``+123`` or `` 123``) and returns
None for anything else; that request then goes through FastAPI's own handler, so every
validation error keeps exactly its current shape and message.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from fastapi import Request, Response
from fastapi.routing import APIRoute

#: Reads an endpoint's parameters (besides ``request``) from a request; None: let FastAPI do it.
Parse = Callable[[Request], dict[str, Any] | None]
Handler = Callable[[Request], Coroutine[Any, Any, Response]]
E = TypeVar("E", bound=Callable[..., Any])

PARSE_ATTR = "__tidemq_lean_parse__"


def declared_query(dependant: Any) -> frozenset[str]:
    """The query parameter names of an endpoint and its dependencies."""
    names = {p.alias for p in dependant.query_params}
    for sub in dependant.dependencies:
        names |= declared_query(sub)
    return frozenset(names)


def lean(parse: Parse) -> Callable[[E], E]:
    """Mark an endpoint of a ``LeanRoute`` router as served through ``parse``."""

    def mark(endpoint: E) -> E:
        setattr(endpoint, PARSE_ATTR, parse)
        return endpoint

    return mark


def plain_int(text: str | None, low: int, high: int | None = None) -> int | None:
    """``text`` as an int when it is plain ASCII digits within ``low..high``; else None."""
    if text is None or not text.isascii() or not text.isdigit() or len(text) > 18:
        return None
    value = int(text)
    if value < low or (high is not None and value > high):
        return None
    return value


class LeanRoute(APIRoute):
    """An ``APIRoute`` that serves ``@lean`` endpoints by their ``parse`` (see module doc)."""

    def get_route_handler(self) -> Handler:
        full = super().get_route_handler()
        parse: Parse | None = getattr(self.endpoint, PARSE_ATTR, None)
        if parse is None:
            return full
        endpoint = self.endpoint
        known = declared_query(self.dependant)

        async def handler(request: Request) -> Response:
            # an unknown query parameter goes the full way, whose check refuses it
            params = parse(request) if request.query_params.keys() <= known else None
            if params is None:
                return await full(request)
            response: Response = await endpoint(request=request, **params)
            return response

        return handler
