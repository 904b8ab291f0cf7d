"""The console process: HTML pages rendered on the server (Jinja2), one small script, no CDN.

Each page calls ``views`` and renders a template; an ``ApiError`` is shown inside the page (a
red box naming the code and message), never as a blank screen. Actions are plain forms that
POST here and redirect back with the outcome (post/redirect/get). The pages are not part of
the REST contract: they are left out of the OpenAPI document, which lists /healthz and /metrics.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import FastAPI, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from prometheus_client import CollectorRegistry, Counter, Histogram

from services.common.app import create_app
from services.common.auth.client import use_account
from services.console import views
from services.console.client import ApiError, ConsoleClient
from services.console.settings import ConsoleSettings

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
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


def parse_ms(value: str) -> int | None:
    """A form time: epoch ms, or an ISO time (``datetime-local`` input, read as UTC)."""
    value = value.strip()
    if not value:
        return None
    if value.isdigit():
        return int(value)
    dt = datetime.fromisoformat(value)
    return int((dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp() * 1000)


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

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await c.close()

    app = create_app("tidemq console", registry, lifespan)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    templates = Jinja2Templates(directory=HERE / "templates")
    templates.env.filters["ms"] = fmt_ms
    templates.env.globals.update(nav=NAV, age=fmt_age, body_views=views.body_views,
                                 trace=views.trace)
    page_size = settings.page_messages

    async def render(request: Request, name: str, gather: Callable[[], Awaitable[dict[str, Any]]]
                     ) -> Response:
        start = time.perf_counter()
        ctx: dict[str, Any] = {"q": request.query_params, "error": "",
                               "done": request.query_params.get("done", ""),
                               "failed": request.query_params.get("failed", "")}
        try:
            ctx.update(await gather())
            pages.labels(name, "ok").inc()
        except ApiError as exc:
            ctx["error"] = f"{exc.code}: {exc.message}"
            pages.labels(name, "error").inc()
        except ValueError as exc:  # a malformed form value (a time, a number)
            ctx["error"] = f"BAD_REQUEST: {exc}"
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


    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def cluster(request: Request) -> Response:
        return await render(request, "cluster", lambda: views.cluster_view(
            c, settings.checker_urls, settings.scheduler_urls))

    @app.get("/topics", response_class=HTMLResponse, include_in_schema=False)
    async def topics(request: Request, topic: str = "") -> Response:
        return await render(request, "topics", lambda: views.topics_view(c, topic))

    @app.post("/topics", response_class=HTMLResponse, include_in_schema=False)
    async def topic_create(broker: str = Form(...), topic: str = Form(...),
                           queues: int = Form(8)) -> Response:
        return await act("/topics", views.create_topic(c, broker, topic.strip(), queues),
                         topic=topic.strip())

    @app.get("/groups", response_class=HTMLResponse, include_in_schema=False)
    async def groups(request: Request, group: str = "") -> Response:
        return await render(request, "groups", lambda: views.groups_view(c, group))

    @app.post("/groups/reset", response_class=HTMLResponse, include_in_schema=False)
    async def group_reset(request: Request, group: str = Form(...), topic: str = Form(...),
                          to: str = Form("latest"), at: str = Form(""),
                          confirm: str = Form("")) -> Response:
        async def gather() -> dict[str, Any]:
            plan = await views.reset_plan(c, group, topic, to, parse_ms(at))
            return {"group": group, "topic": topic, "to": to, "at": at, "plan": plan}

        if confirm == "yes":
            try:
                plan = await views.reset_plan(c, group, topic, to, parse_ms(at))
                return await act("/groups", views.reset_offsets(c, group, plan), group=group)
            except (ApiError, ValueError) as exc:
                return back("/groups", failed=str(exc), group=group)
        return await render(request, "reset", gather)

    @app.get("/messages", response_class=HTMLResponse, include_in_schema=False)
    async def messages(request: Request, id: str = "", topic: str = "", key: str = "",
                       begin: str = "", end: str = "") -> Response:
        async def gather() -> dict[str, Any]:
            out: dict[str, Any] = {"found": None, "results": None}
            if id:
                broker, m = await views.find_message(c, id.strip())
                out["found"], out["broker"] = m, broker.name
            elif topic:
                out["results"] = await views.search_messages(
                    c, topic.strip(), key.strip(), parse_ms(begin), parse_ms(end), page_size)
            return out

        return await render(request, "messages", gather)

    @app.get("/transactions", response_class=HTMLResponse, include_in_schema=False)
    async def transactions(request: Request, producer_group: str = "") -> Response:
        return await render(request, "transactions", lambda: views.transactions_view(
            c, producer_group.strip(), page_size))

    @app.get("/timers", response_class=HTMLResponse, include_in_schema=False)
    async def timers(request: Request, id: str = "") -> Response:
        async def gather() -> dict[str, Any]:
            out: dict[str, Any] = {"rows": await views.timers_view(c), "found": None,
                                   "now_ms": views.now_ms()}
            if id:
                _, out["found"] = await views.find_message(c, id.strip())
            return out

        return await render(request, "timers", gather)

    @app.post("/timers/cancel", response_class=HTMLResponse, include_in_schema=False)
    async def timer_cancel(message_id: str = Form(...)) -> Response:
        return await act("/timers", views.cancel_timer(c, message_id.strip()), id=message_id)

    @app.get("/dlq", response_class=HTMLResponse, include_in_schema=False)
    async def dlq(request: Request, group: str = "") -> Response:
        async def gather() -> dict[str, Any]:
            rows = await views.dlq_view(c, group.strip(), page_size) if group else None
            return {"group": group, "rows": rows}

        return await render(request, "dlq", gather)

    @app.post("/dlq/resend", response_class=HTMLResponse, include_in_schema=False)
    async def dlq_resend(group: str = Form(...), message_id: str = Form("")) -> Response:
        async def action() -> str:
            outcomes = await views.resend(c, group.strip(), message_id.strip())
            parts = [f"{o.message_id} → {o.topic or '?'}: "
                     + (f"sent as {o.result.get('message_id')}" if o.result is not None
                        else o.error) for o in outcomes]
            ok = sum(o.result is not None for o in outcomes)
            return f"{ok} resent, {len(outcomes) - ok} failed. " + "; ".join(parts)

        return await act("/dlq", action(), group=group)

    return app
