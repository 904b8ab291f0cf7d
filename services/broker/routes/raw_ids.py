"""Ids that may hold ``/`` reach their endpoint percent-encoded (docs/api.md "Ids in paths").

A message id (``order/42``, ``a/b/../c``) or a client id is any text the send or heartbeat
accepted. In a path it travels percent-encoded (``/v1/messages/order%2F42``), but the ASGI
server decodes the path before routing, so ``order%2F42`` would become two segments and
``order%2Ftrace`` the trace of ``order``. ``RawIdPaths`` (outermost, so the ACL rules see the
same path) cuts the *raw* path into segments and hands the id's segment on percent-encoded as a
whole; the route decodes it with ``path_id``. Every other segment is decoded as usual.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import quote, unquote

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]


def id_segment(segments: list[bytes]) -> int | None:
    """The index of the free-text id among the raw path's segments (``b""`` first), if any:
    ``/v1/messages/{id}[/trace|/schedule]`` and ``/v1/{groups|producers}/{g}/members/{id}``."""
    if len(segments) >= 4 and segments[1] == b"v1" and segments[2] == b"messages":
        return 3
    if (len(segments) == 6 and segments[1] == b"v1"
            and segments[2] in (b"groups", b"producers") and segments[4] == b"members"):
        return 5
    return None


def path_id(value: str) -> str:
    """The id a route received from ``RawIdPaths`` (still percent-encoded), decoded."""
    return unquote(value)


class RawIdPaths:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        raw = scope.get("raw_path") if scope["type"] == "http" else None
        if raw:
            segments = raw.split(b"?", 1)[0].split(b"/")
            at = id_segment(segments)
            if at is not None:
                parts = [unquote(s.decode("latin-1"), errors="replace") for s in segments]
                parts[at] = quote(unquote(segments[at].decode("latin-1")), safe="")
                scope = {**scope, "path": "/".join(parts)}
        await self.app(scope, receive, send)
