"""Who is using the console, and proof that a form came from its own pages.

Every browser gets a session (an opaque id in the ``tidemq_console`` cookie: ``HttpOnly``,
``SameSite=Strict``, ``Secure`` under TLS) holding a CSRF token that every state-changing form
carries. With ACL on, a session is signed in with an account's access key and secret key
(checked against the ACL file) and the console's calls made for it are signed with that account,
so the ACL decides what each person sees and does. A confirmation (offset reset, resolving a
discarded transaction) is a second request naming a one-time token that holds what was shown.

``SessionMiddleware`` (ASGI) finds or starts the session, refuses a request whose ``Host`` is not
loopback while ACL is off (DNS rebinding), sends a visitor who is not signed in to ``/login``,
and sets ``acting_as`` for the console's client; ``check_form`` is the check of every POST.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, MutableMapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
from fastapi import Request
from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse, RedirectResponse

from tidemq_server.common.auth.client import SigningAuth
from tidemq_server.common.auth.store import AclStore
from tidemq_server.common.constants import (
    CONSOLE_COOKIE,
    CONSOLE_PENDING_MAX,
    CONSOLE_SESSIONS_MAX,
    LOOPBACK_HOSTS,
)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: The account the console's calls are signed with while it serves a signed-in person (None:
#: the console's own account, e.g. for its sampler and whenever ACL is off).
acting_as: ContextVar[httpx.Auth | None] = ContextVar("acting_as", default=None)

#: Served to anyone: liveness, metrics, the sign-in page, the stylesheet and script.
OPEN_PATHS = frozenset({"/healthz", "/metrics", "/login"})
OPEN_PREFIXES = ("/static/",)
#: Served without a session at all (probes and scrapers carry no cookie).
SESSIONLESS = ("/healthz", "/metrics", "/static/")


class FormRefused(Exception):
    """A state-changing request that does not come from the console's own page (403)."""


@dataclass
class PendingConfirmation:
    """A confirmation waiting for its second request: what it does, with what was shown."""

    kind: str
    params: dict[str, Any]


@dataclass
class BrowserSession:
    sid: str
    csrf: str
    expires: float
    user: str = ""  # the signed-in account's name ("" = nobody; always "" with ACL off)
    auth: SigningAuth | None = field(default=None, repr=False)
    pending: OrderedDict[str, PendingConfirmation] = field(default_factory=OrderedDict)

    def expect(self, kind: str, params: dict[str, Any]) -> str:
        """A one-time token for a confirmation of ``kind`` with ``params``."""
        token = secrets.token_urlsafe(24)
        self.pending[token] = PendingConfirmation(kind, params)
        while len(self.pending) > CONSOLE_PENDING_MAX:
            self.pending.popitem(last=False)
        return token

    def confirm(self, kind: str, token: str) -> PendingConfirmation | None:
        """The confirmation ``token`` stands for, once (None: unknown, used or of another kind)."""
        found = self.pending.pop(token, None)
        return found if found is not None and found.kind == kind else None


class BrowserSessions:
    """Browser sessions in memory (a restart signs everyone out), the oldest dropped past the
    maximum. Signed-in sessions are kept apart from those of visitors, so a flood of cookie-less
    requests can never push a signed-in person out."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._visitors: OrderedDict[str, BrowserSession] = OrderedDict()
        self._signed_in: OrderedDict[str, BrowserSession] = OrderedDict()

    def get(self, sid: str | None) -> BrowserSession | None:
        for table in (self._signed_in, self._visitors):
            found = table.get(sid or "")
            if found is not None:
                if found.expires < time.monotonic():
                    del table[found.sid]
                    return None
                return found
        return None

    def start(self, user: str = "", auth: SigningAuth | None = None) -> BrowserSession:
        """A new session: a visitor's, or (``user``) a signed-in one."""
        s = BrowserSession(secrets.token_urlsafe(32), secrets.token_urlsafe(32),
                    time.monotonic() + self.ttl_s, user, auth)
        table = self._signed_in if user else self._visitors
        table[s.sid] = s
        while len(table) > CONSOLE_SESSIONS_MAX:
            table.popitem(last=False)
        return s

    def end(self, s: BrowserSession) -> None:
        self._visitors.pop(s.sid, None)
        self._signed_in.pop(s.sid, None)


def verify_account(acl: AclStore, access_key: str, secret_key: str) -> tuple[str, SigningAuth]:
    """The account's name and signer; ValueError when the key pair is not an account's."""
    user = acl.policy().users.get(access_key)
    if user is None or not hmac.compare_digest(user.secret_key.encode(), secret_key.encode()):
        raise ValueError("unknown access key or wrong secret key")
    return user.name, SigningAuth(user.access_key, user.secret_key)


def session_of(request: Request) -> BrowserSession:
    s: BrowserSession = request.scope["state"]["console_session"]
    return s


def _origin_of(value: str) -> str:
    parts = urlsplit(value)
    return f"{parts.scheme}://{parts.netloc}".lower()


def check_form(request: Request, form_token: str) -> BrowserSession:
    """A POST must come from a page of this console: its ``Origin`` (or ``Referer``) is this
    console, and its form carries the session's CSRF token. ``FormRefused`` saying what is wrong."""
    s = session_of(request)
    own = f"{request.url.scheme}://{request.headers.get('host', '')}".lower()
    sent = request.headers.get("origin") or request.headers.get("referer") or ""
    if sent and _origin_of(sent) != own:
        raise FormRefused(
            f"cross-site request refused: it comes from {_origin_of(sent)}, not {own}")
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        raise FormRefused("cross-site request refused (Sec-Fetch-Site)")
    if not form_token or not hmac.compare_digest(form_token.encode(), s.csrf.encode()):
        raise FormRefused(
            "the form's CSRF token is missing or stale: reload the page and try again")
    return s


class SessionMiddleware:
    def __init__(self, app: ASGIApp, sessions: BrowserSessions, acl_on: bool, secure: bool) -> None:
        self.app, self.sessions, self.acl_on, self.secure = app, sessions, acl_on, secure

    def cookie(self, s: BrowserSession) -> str:
        return (f"{CONSOLE_COOKIE}={s.sid}; Path=/; HttpOnly; SameSite=Strict"
                + ("; Secure" if self.secure else ""))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host = urlsplit("//" + headers.get("host", "")).hostname or ""
        if not self.acl_on and host not in LOOPBACK_HOSTS:
            await PlainTextResponse(
                f"this console has no ACL and answers only on loopback, not as {host!r}",
                status_code=403)(scope, receive, send)
            return
        path = scope["path"]
        if path.startswith(SESSIONLESS):
            await self.app(scope, receive, send)
            return
        cookies = _cookies(headers.get("cookie", ""))
        s = self.sessions.get(cookies.get(CONSOLE_COOKIE))
        fresh = s is None
        if s is None:
            s = self.sessions.start()
        scope.setdefault("state", {})["console_session"] = s
        opened = path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)
        if self.acl_on and not s.user and not opened:
            if scope["method"] in ("GET", "HEAD"):
                query = scope.get("query_string", b"").decode("latin-1")
                target = path + (f"?{query}" if query else "")
                response: Any = RedirectResponse(f"/login?next={quote(target, safe='')}", 303)
            else:
                response = PlainTextResponse("sign in first", status_code=403)
            if fresh:
                response.headers.append("set-cookie", self.cookie(s))
            await response(scope, receive, send)
            return
        token = acting_as.set(s.auth if self.acl_on else None)

        async def send_with_cookie(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                state = scope["state"]
                current: BrowserSession = state["console_session"]
                if fresh or state.get("console_session_new"):
                    message.setdefault("headers", []).append(
                        (b"set-cookie", self.cookie(current).encode("latin-1")))
            await send(message)

        try:
            await self.app(scope, receive, send_with_cookie)
        finally:
            acting_as.reset(token)


def renew(request: Request, sessions: BrowserSessions, user: str = "",
          auth: SigningAuth | None = None) -> BrowserSession:
    """A new session for a sign-in (``user``) or a sign-out: the old id is dropped (no
    fixation)."""
    sessions.end(session_of(request))
    s = sessions.start(user, auth)
    request.scope["state"]["console_session"] = s
    request.scope["state"]["console_session_new"] = True
    return s


def _cookies(header: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in header.split(";"):
        name, _, value = part.strip().partition("=")
        if name and name not in out:
            out[name] = value
    return out
