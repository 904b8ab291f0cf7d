"""The broker's FastAPI app: the lifespan opens the Broker, the routers serve it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Callable
from types import FrameType
from typing import Any

from fastapi import FastAPI
from starlette.middleware import Middleware

from tidemq_server.broker.grpc import GrpcFrontDoor
from tidemq_server.broker.observability import BrokerMetrics
from tidemq_server.broker.routes import ROUTERS
from tidemq_server.broker.routes.raw_ids import RawIdPaths
from tidemq_server.broker.service import Broker
from tidemq_server.broker.settings import BrokerSettings
from tidemq_server.common.app import create_app
from tidemq_server.common.auth import service_gate
from tidemq_server.common.door import LeanMiddleware

log = logging.getLogger(__name__)

Handler = Callable[[int, FrameType | None], Any]


def create_broker_app(settings: BrokerSettings | None = None, *,
                      release_on_signal: bool = False) -> FastAPI:
    """The app of one broker. ``release_on_signal``: on SIGTERM/SIGINT, answer held pulls at
    once, so that the server's graceful shutdown is not kept waiting by long polls."""
    settings = settings if settings is not None else BrokerSettings()
    metrics = BrokerMetrics()
    gate = service_gate(settings, metrics.registry)  # one gate for both doors

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        broker = Broker(settings, metrics)
        await broker.start()
        app.state.broker = broker
        front = GrpcFrontDoor(broker, settings, gate)  # RocketMQ 5 clients, beside REST
        try:
            await front.start()
        except BaseException:
            await broker.stop()
            raise
        app.state.grpc = front
        # nameservers advertise the gRPC door only when it really listens (a busy default
        # port leaves it off)
        broker.registrar.advertise_grpc(f"{front.door.host}:{front.door.port}"
                                        if front.server is not None else None)

        def begin_shutdown() -> None:
            broker.begin_shutdown()
            front.begin_shutdown()

        restore = _chain_signals(begin_shutdown) if release_on_signal else None
        try:
            yield
        finally:
            if restore is not None:
                restore()
            await front.close()
            await broker.stop()

    def health() -> str | None:
        broker: Broker | None = getattr(app.state, "broker", None)
        return broker.health() if broker is not None else None

    app = create_app("tidemq broker", metrics.registry, lifespan, health=health,
                     gate=gate)
    # the broker is its process (``python -m tidemq_server.broker``): it may stop it (POST
    # /internal/v1/replication/restart, for a rolling restart)
    app.state.own_process = release_on_signal
    for router in ROUTERS:
        app.include_router(router)
    app.add_middleware(RawIdPaths)  # outermost: ids with "/" (routes/raw_ids.py)
    if settings.lean_door == "asgi":  # innermost: inside the ACL (tidemq_server.common.door)
        app.user_middleware.append(Middleware(LeanMiddleware, fastapi=app))
    return app


def _chain_signals(callback: Callable[[], None]) -> Callable[[], None] | None:
    """Run ``callback`` on the loop when SIGTERM/SIGINT arrives, then the server's own handler
    (uvicorn installs it before the lifespan starts). Returns a function undoing it."""
    loop = asyncio.get_running_loop()
    installed: dict[int, Handler] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)
        if not callable(previous):
            continue

        def handler(signum: int, frame: FrameType | None, previous: Handler = previous) -> None:
            loop.call_soon_threadsafe(callback)
            previous(signum, frame)

        try:
            signal.signal(sig, handler)
        except ValueError:  # not the main thread (e.g. a test client): nothing to chain
            return None
        installed[sig] = previous

    def restore() -> None:
        for sig, previous in installed.items():
            with contextlib.suppress(ValueError):
                signal.signal(sig, previous)

    return restore
