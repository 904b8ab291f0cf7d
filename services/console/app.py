"""The console process: HTML pages rendered on the server (Jinja2), one small script, no CDN.

Each page calls ``views`` and renders a template; an ``ApiError`` is shown inside the page (a
red box naming the code and message), never as a blank screen. Actions are plain forms that
POST here and redirect back with the outcome (post/redirect/get). The pages are not part of
the REST contract: they are left out of the OpenAPI document, which lists /healthz and /metrics.

Every POST is checked by ``form_guard`` (same origin, the session's CSRF token: sessions.py);
the offset reset and the resolving of a discarded transaction are confirmed by a second POST
naming a one-time token that holds what the first showed. With ACL on, ``/login`` signs a
person in with an account's keys and the console acts as that account.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import Depends, FastAPI, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from prometheus_client import CollectorRegistry, Counter, Histogram
from tidemq.protocol import ErrorCode, ProtocolError

from tidemq_server.common.app import create_app
from tidemq_server.common.auth.client import use_account
from tidemq_server.common.auth.store import AclStore
from tidemq_server.console import deadletters, views
from tidemq_server.console.client import ApiError, ConsoleClient
from tidemq_server.console.pagequery import PageQuery, read_query
from tidemq_server.console.sampler import Sampler
from tidemq_server.console.sessions import (
    BrowserSession,
    BrowserSessions,
    FormRefused,
    SessionMiddleware,
    check_form,
    renew,
    session_of,
    verify_account,
)
from tidemq_server.console.settings import ConsoleSettings
from tidemq_server.console.timeline import full_trace

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
#: The REST API's names a page understands too (``/messages?message_id=…``).
MESSAGE_ALIASES = {"message_id": "id", "begin_ms": "begin", "end_ms": "end"}
NAV = [("/", "Cluster"), ("/topics", "Topics"), ("/groups", "Consumer groups"),
       ("/messages", "Messages"), ("/transactions", "Transactions"), ("/timers", "Timers"),
       ("/dlq", "Dead letters")]


def fmt_ms(ms: Any) -> str:
    """Epoch ms as UTC time ("" for none)."""
    if not ms:
        return ""
    return datetime.fromtimestamp(int(ms) / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def fmt_age(ms: Any, now_ms: int) -> str:
    if not ms:
        return ""
    s = max(0, (now_ms - int(ms)) // 1000)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def fmt_rate(value: float | None) -> str:
    """Messages per second ("—" until two samples were taken)."""
    if value is None:
        return "—"
    return f"{value:.1f}/s" if value < 100 else f"{value:,.0f}/s"


def fmt_bytes(value: float | None) -> str:
    if value is None:
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def parse_ms(value: str) -> int | None:
    """A form time: epoch ms, or an ISO time (``datetime-local`` input, read as UTC)."""
    value = value.strip()
    if not value:
        return None
    if value.isdigit():
        return int(value)
    dt = datetime.fromisoformat(value)
    return int((dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp() * 1000)


STALE = ("CONFIRMATION_EXPIRED: this confirmation was already used or has expired; "
         "review the action again")


async def _none(**values: Any) -> dict[str, Any]:
    return values


def _local(target: str) -> str:
    """A redirect target on this console only (an absolute or scheme-relative URL is "/")."""
    return target if target.startswith("/") and not target.startswith(("//", "/\\")) else "/"


async def form_guard(request: Request, csrf: str = Form("")) -> BrowserSession:
    """Every POST: from this console's own page (sessions.check_form), else 403."""
    try:
        return check_form(request, csrf)
    except FormRefused as exc:
        raise ProtocolError(ErrorCode.FORBIDDEN, str(exc)) from exc


Guarded = Annotated[BrowserSession, Depends(form_guard)]


def create_console_app(settings: ConsoleSettings,
                       client: ConsoleClient | None = None) -> FastAPI:
    registry = CollectorRegistry()
    use_account(settings.access_key, settings.secret_key)  # signs its calls (ACL on)
    pages = Counter("tidemq_console_pages", "Pages rendered by page and result (ok, error)",
                    ["page", "result"], registry=registry)
    seconds = Histogram("tidemq_console_page_seconds", "Time to gather and render a page",
                        ["page"], registry=registry)
    c = client or ConsoleClient(settings.nameserver_urls, settings.token,
                                settings.request_timeout_s)

    rounds = Counter("tidemq_console_sample_rounds", "Rounds of sampling the brokers' metrics "
                     "and the groups' lag", registry=registry)
    sampler = Sampler(c, settings.sample_interval_s, settings.history_samples, rounds)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        sampler.start()
        try:
            yield
        finally:
            await sampler.stop()
            await c.close()

    # pages keep their own query (done=, failed= after an action): not the strict API rule
    app = create_app("tidemq console", registry, lifespan, strict_query=False)
    acl = AclStore(settings.acl_file) if settings.acl_file else None
    sessions = BrowserSessions(settings.session_ttl_s)
    app.add_middleware(SessionMiddleware, sessions=sessions, acl_on=acl is not None,
                       secure=settings.tls)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    templates = Jinja2Templates(directory=HERE / "templates")
    templates.env.filters["ms"] = fmt_ms
    templates.env.globals.update(nav=NAV, age=fmt_age, body_views=views.body_views,
                                 rate=fmt_rate, size=fmt_bytes)
    page_size = settings.page_messages

    async def render(request: Request, name: str, gather: Callable[[], Awaitable[dict[str, Any]]],
                     page: PageQuery | None = None) -> Response:
        """``page``: the query a GET page read (its unknown parameters are named on it)."""
        start = time.perf_counter()
        ctx: dict[str, Any] = {"q": page or request.query_params, "error": "",
                               "ignored": page.note if page else "",
                               "done": request.query_params.get("done", ""),
                               "failed": request.query_params.get("failed", ""),
                               "acl": acl is not None, "session": session_of(request)}
        try:
            ctx.update(await gather())
            pages.labels(name, "ok").inc()
        except ApiError as exc:
            ctx["error"] = f"{exc.code}: {exc.message}"
            pages.labels(name, "error").inc()
        except ValueError as exc:  # a malformed form value (a time, a number)
            ctx["error"] = f"BAD_REQUEST: {exc}"
            pages.labels(name, "error").inc()
        except Exception as exc:  # an answer of an unexpected shape: say so, never a blank page
            log.exception("console: page %s failed", name)
            ctx["error"] = f"INTERNAL_ERROR: {type(exc).__name__}: {exc}"
            pages.labels(name, "error").inc()
        ctx["elapsed_ms"] = round((time.perf_counter() - start) * 1000)
        seconds.labels(name).observe(time.perf_counter() - start)
        return templates.TemplateResponse(request, f"{name}.html", ctx)

    def back(path: str, **params: str) -> RedirectResponse:
        query = urlencode({k: v for k, v in params.items() if v})
        return RedirectResponse(f"{path}?{query}" if query else path, status_code=303)

    async def act(path: str, action: Awaitable[str], **keep: str) -> RedirectResponse:
        try:
            return back(path, done=await action, **keep)
        except ApiError as exc:
            return back(path, failed=f"{exc.code}: {exc.message}", **keep)
        except Exception as exc:  # never a blank page
            log.exception("console: action on %s failed", path)
            return back(path, failed=f"INTERNAL_ERROR: {type(exc).__name__}: {exc}", **keep)


    @app.get("/login", response_class=HTMLResponse, include_in_schema=False)
    async def login_page(request: Request, next: str = "/") -> Response:
        if acl is None:
            return back("/")
        return await render(request, "login", lambda: _none(next=_local(next)),
                            read_query(request.query_params, ("next",)))

    @app.post("/login", response_class=HTMLResponse, include_in_schema=False)
    async def login(request: Request, _: Guarded, access_key: str = Form(""),
                    secret_key: str = Form(""), next: str = Form("/")) -> Response:
        if acl is None:
            return back("/")
        try:
            name, auth = verify_account(acl, access_key.strip(), secret_key)
        except ValueError as exc:
            log.warning("console: a sign-in with access key %r was refused", access_key[:64])
            return back("/login", failed=f"UNAUTHORIZED: {exc}", next=_local(next))
        renew(request, sessions, name, auth)
        log.info("console: %s signed in", name)
        return RedirectResponse(_local(next), status_code=303)

    @app.post("/logout", response_class=HTMLResponse, include_in_schema=False)
    async def logout(request: Request, _: Guarded) -> Response:
        renew(request, sessions)
        return back("/login" if acl is not None else "/")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def cluster(request: Request) -> Response:
        return await render(request, "cluster", lambda: views.cluster_view(
            c, settings.checker_urls, settings.scheduler_urls, sampler),
            read_query(request.query_params, ()))

    @app.get("/topics", response_class=HTMLResponse, include_in_schema=False)
    async def topics(request: Request, topic: str = "") -> Response:
        return await render(request, "topics", lambda: views.topics_view(c, topic, sampler),
                            read_query(request.query_params, ("topic",)))

    @app.post("/topics", response_class=HTMLResponse, include_in_schema=False)
    async def topic_create(_: Guarded, broker: str = Form(...), topic: str = Form(...),
                           queues: int = Form(8)) -> Response:
        return await act("/topics", views.create_topic(c, broker, topic.strip(), queues),
                         topic=topic.strip())

    @app.get("/groups", response_class=HTMLResponse, include_in_schema=False)
    async def groups(request: Request, group: str = "") -> Response:
        return await render(request, "groups", lambda: views.groups_view(c, group, sampler),
                            read_query(request.query_params, ("group",)))

    @app.post("/groups/reset", response_class=HTMLResponse, include_in_schema=False)
    async def group_reset(request: Request, s: Guarded, group: str = Form(...),
                          topic: str = Form(...), to: str = Form("latest"),
                          at: str = Form("")) -> Response:
        """The first step: the plan, and a one-time token confirming exactly that plan."""
        async def gather() -> dict[str, Any]:
            plan = await views.reset_plan(c, group, topic, to, parse_ms(at))
            token = s.expect("reset", {"group": group, "plan": plan})
            return {"group": group, "topic": topic, "plan": plan, "token": token}

        return await render(request, "reset", gather)

    @app.post("/groups/reset/confirm", response_class=HTMLResponse, include_in_schema=False)
    async def group_reset_confirm(s: Guarded, token: str = Form("")) -> Response:
        pending = s.confirm("reset", token)
        if pending is None:
            return back("/groups", failed=STALE)
        group = str(pending.params["group"])
        return await act("/groups", views.reset_offsets(c, group, pending.params["plan"]),
                         group=group)

    @app.get("/messages", response_class=HTMLResponse, include_in_schema=False)
    async def messages(request: Request) -> Response:
        page = read_query(request.query_params, ("id", "topic", "key", "begin", "end"),
                          MESSAGE_ALIASES)
        id, topic, key = page.get("id"), page.get("topic"), page.get("key")
        begin, end = page.get("begin"), page.get("end")

        async def gather() -> dict[str, Any]:
            out: dict[str, Any] = {"found": None, "results": None}
            if id:
                broker, m = await views.find_message(c, id.strip())
                out["found"], out["broker"] = m, broker.name
                out["tr"] = await full_trace(c, broker, id.strip())
            elif topic:
                out["results"] = await views.search_messages(
                    c, topic.strip(), key.strip(), parse_ms(begin), parse_ms(end), page_size)
            return out

        return await render(request, "messages", gather, page)

    @app.get("/transactions", response_class=HTMLResponse, include_in_schema=False)
    async def transactions(request: Request, producer_group: str = "") -> Response:
        return await render(request, "transactions", lambda: views.transactions_view(
            c, producer_group.strip(), page_size),
            read_query(request.query_params, ("producer_group",)))

    @app.post("/transactions/resolve", response_class=HTMLResponse, include_in_schema=False)
    async def transaction_resolve(request: Request, s: Guarded, broker: str = Form(...),
                                  transaction_id: str = Form(...),
                                  action: str = Form(...)) -> Response:
        async def gather() -> dict[str, Any]:
            tx = await views.discarded_tx(c, broker, transaction_id.strip())
            token = s.expect("resolve", {"broker": broker, "action": action,
                                         "transaction_id": transaction_id.strip()})
            return {"tx": tx, "broker": broker, "action": action, "token": token}

        return await render(request, "resolve", gather)

    @app.post("/transactions/resolve/confirm", response_class=HTMLResponse,
              include_in_schema=False)
    async def transaction_resolve_confirm(s: Guarded, token: str = Form("")) -> Response:
        pending = s.confirm("resolve", token)
        if pending is None:
            return back("/transactions", failed=STALE)
        p = pending.params
        return await act("/transactions", views.resolve_discarded(
            c, str(p["broker"]), str(p["transaction_id"]), str(p["action"])))

    @app.get("/timers", response_class=HTMLResponse, include_in_schema=False)
    async def timers(request: Request) -> Response:
        page = read_query(request.query_params, ("id",), {"message_id": "id"})
        id = page.get("id")

        async def gather() -> dict[str, Any]:
            out: dict[str, Any] = {**await views.timers_view(c), "found": None,
                                   "now_ms": views.now_ms()}
            if id:
                broker, out["found"] = await views.find_message(c, id.strip())
                out["tr"] = await full_trace(c, broker, id.strip())
            return out

        return await render(request, "timers", gather, page)

    @app.post("/timers/cancel", response_class=HTMLResponse, include_in_schema=False)
    async def timer_cancel(_: Guarded, message_id: str = Form(...),
                           topic: str = Form("")) -> Response:
        return await act("/timers", views.cancel_timer(c, message_id.strip(), topic.strip()),
                         id=message_id)

    @app.get("/dlq", response_class=HTMLResponse, include_in_schema=False)
    async def dlq(request: Request, group: str = "") -> Response:
        async def gather() -> dict[str, Any]:
            rows = (await deadletters.dlq_view(c, group.strip(), page_size) if group
                    else None)
            return {"group": group, "rows": rows}

        return await render(request, "dlq", gather, read_query(request.query_params, ("group",)))

    @app.post("/dlq/resend", response_class=HTMLResponse, include_in_schema=False)
    async def dlq_resend(_: Guarded, group: str = Form(...),
                         message_id: str = Form("")) -> Response:
        async def action() -> str:
            outcomes = await deadletters.resend(c, group.strip(), message_id.strip())
            return deadletters.summary(outcomes)

        return await act("/dlq", action(), group=group)

    return app
