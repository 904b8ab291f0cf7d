"""Run one service as one asyncio process: settings checked at start, text or JSON logs
(services/common/logs.py), uvloop, clean shutdown on SIGTERM."""

from __future__ import annotations

import gc
import logging
import sys
from typing import Any, TypeVar

import uvicorn
from fastapi import FastAPI
from pydantic import ValidationError
from pydantic_settings import BaseSettings

from tidemq_server.common.constants import HTTP_SERVER_KEEP_ALIVE_S
from tidemq_server.common.httpserver import JsonErrorsProtocol
from tidemq_server.common.logs import RequestIds, setup_logging
from tidemq_server.common.tls import ServerTls

S = TypeVar("S", bound=BaseSettings)


def settings_or_exit(settings_class: type[S], service: str) -> S:
    """The service's settings from the environment; a bad one (``…_LOG_LEVEL=verbose``) stops
    the process with one line on stderr naming the variable and what it accepts, exit
    status 2 (not a traceback)."""
    try:
        return settings_class()
    except ValidationError as exc:
        prefix = str(settings_class.model_config.get("env_prefix", ""))
        problems = "; ".join(_problem(prefix, settings_class, err) for err in exc.errors())
        print(f"{service}: bad setting: {problems}", file=sys.stderr, flush=True)
        sys.exit(2)


def _problem(prefix: str, settings_class: type[BaseSettings], err: Any) -> str:
    loc = err.get("loc", ())
    message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    if not loc:
        return message
    name = str(loc[0])
    var = f"{prefix}{name}".upper() if name in settings_class.model_fields else name
    given = err.get("input")
    shown = f"={given!r}" if isinstance(given, str | int | float) else ""
    return f"{var}{shown}: {message}"


def serve(app: FastAPI, host: str, port: int, log_level: str = "info",
          tls: ServerTls | None = None, log_format: str = "text",
          service: str | None = None,
          protocol: type[JsonErrorsProtocol] = JsonErrorsProtocol) -> None:
    """Serve until SIGINT/SIGTERM; uvicorn runs the app's lifespan shutdown on either.
    With ``tls`` the port speaks HTTPS only: a plain-HTTP request there gets no HTTP answer
    (the TLS handshake fails and the connection is closed; docs/operations.md). With
    ``log_format`` json, log lines are JSON objects naming ``service`` (default: the app's
    title without "tidemq ") and the request being handled. ``protocol``: the HTTP/1.1 server
    protocol (the broker's serves its hot routes itself: tidemq_server.common.door_http)."""
    setup_logging(log_level, log_format, service or app.title.removeprefix("tidemq "))
    if log_format == "json":
        app.add_middleware(RequestIds)  # outermost: every line of a request has its id
    # Request handling allocates many short-lived objects; the default generation-0 threshold
    # (700) runs the collector thousands of times a second under load. Measured ~10% of broker
    # CPU saved on the transaction benchmark with these thresholds.
    gc.set_threshold(50_000, 20, 20)
    config = uvicorn.Config(
        app, host=host, port=port, loop="uvloop", http=protocol, log_level=log_level,
        access_log=False, log_config=None, timeout_graceful_shutdown=5, backlog=2048,
        timeout_keep_alive=HTTP_SERVER_KEEP_ALIVE_S,
        **(tls.uvicorn_options() if tls is not None else {}),
    )
    if tls is not None:
        logging.getLogger(__name__).info("TLS on: certificate %s", tls.cert)
    uvicorn.Server(config).run()
