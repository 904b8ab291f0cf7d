"""Run one service as one asyncio process: readable logs, uvloop, clean shutdown on SIGTERM."""

from __future__ import annotations

import gc
import logging
import sys

import uvicorn
from fastapi import FastAPI

from services.common.constants import HTTP_SERVER_KEEP_ALIVE_S
from services.common.tls import ServerTls

LOG_FORMAT = "%(asctime)s %(levelname)-5s %(name)s: %(message)s"


def setup_logging(level: str = "info") -> None:
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, stream=sys.stderr, force=True)
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)


def serve(app: FastAPI, host: str, port: int, log_level: str = "info",
          tls: ServerTls | None = None) -> None:
    """Serve until SIGINT/SIGTERM; uvicorn runs the app's lifespan shutdown on either.
    With ``tls`` the port speaks HTTPS only: a plain-HTTP request there gets no HTTP answer
    (the TLS handshake fails and the connection is closed; docs/operations.md)."""
    setup_logging(log_level)
    # Request handling allocates many short-lived objects; the default generation-0 threshold
    # (700) runs the collector thousands of times a second under load. Measured ~10% of broker
    # CPU saved on the transaction benchmark with these thresholds.
    gc.set_threshold(50_000, 20, 20)
    config = uvicorn.Config(
        app, host=host, port=port, loop="uvloop", http="httptools", log_level=log_level,
        access_log=False, log_config=None, timeout_graceful_shutdown=5, backlog=2048,
        timeout_keep_alive=HTTP_SERVER_KEEP_ALIVE_S,
        **(tls.uvicorn_options() if tls is not None else {}),
    )
    if tls is not None:
        logging.getLogger(__name__).info("TLS on: certificate %s", tls.cert)
    uvicorn.Server(config).run()
