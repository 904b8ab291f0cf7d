"""The REST door's ACL: an ASGI middleware in front of a service's routes.

With ACL on, every request but ``rest_rules.OPEN_PATHS`` must be signed
(``tidemq.protocol.signing``): the middleware reads the body (the signature covers its SHA-256),
checks the signature and the rules, then hands the request, body included, to the app. The
account is left in ``scope["state"]["tidemq_account"]``: the cluster token of ``/internal/``
endpoints is not asked of a signed request (``tidemq_server.common.app.require_token``). Refusals
answer 401 ``UNAUTHORIZED`` / 403 ``FORBIDDEN`` in the API's error shape.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

import orjson
from tidemq.protocol.signing import EMPTY_SHA256

from tidemq_server.common.auth.gate import Gate, Refused
from tidemq_server.common.auth.rest_rules import is_open, needs

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

ACCOUNT_STATE = "tidemq_account"


async def _read_body(receive: Receive) -> tuple[bytes, Message | None]:
    """The whole body; and a disconnect message when the client went away meanwhile."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(chunks), message
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), None


def _replay(body: bytes, disconnect: Message | None, receive: Receive) -> Receive:
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        if disconnect is not None:
            return disconnect
        return await receive()

    return again


class AclMiddleware:
    def __init__(self, app: ASGIApp, gate: Gate) -> None:
        self.app = app
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_open(scope["path"]):
            await self.app(scope, receive, send)
            return
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name, value)
        body, disconnect = await _read_body(receive)
        method = scope["method"]
        raw_path = scope.get("raw_path") or scope["path"].encode()
        query = scope.get("query_string", b"").decode("latin-1")
        try:
            user = self.gate.verify_rest(
                method, raw_path.decode("latin-1"), query,
                hashlib.sha256(body).hexdigest() if body else EMPTY_SHA256,
                headers.get(b"x-tidemq-date", b"").decode("latin-1"),
                headers.get(b"authorization", b"").decode("latin-1"))
            content_type = headers.get(b"content-type", b"").decode("latin-1") or None
            wanted = needs(method, scope["path"], dict(parse_qsl(query)), body, content_type)
            self.gate.authorize("rest", user, wanted, f"{method} {scope['path']}")
        except Refused as refused:
            await _answer(send, refused)
            return
        scope.setdefault("state", {})[ACCOUNT_STATE] = user.name
        await self.app(scope, _replay(body, disconnect, receive), send)


async def _answer(send: Send, refused: Refused) -> None:
    payload = orjson.dumps({"code": refused.code.value, "message": refused.message})
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(payload)).encode())]
    if refused.code.http_status == 401:
        headers.append((b"www-authenticate", b"TIDEMQ-HMAC-SHA256"))
    await send({"type": "http.response.start", "status": refused.code.http_status,
                "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def account_of(scope: Scope) -> str | None:
    """The account a request was signed by (ACL on), or None."""
    state = scope.get("state") or {}
    value = state.get(ACCOUNT_STATE)
    return value if isinstance(value, str) else None
