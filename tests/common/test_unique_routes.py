"""No two routes of a service share a method and a path.

FastAPI serves the first route registered for a method and path and silently never reaches a
later one, so a duplicate is a handler that looks live but never runs. Every service's app is
built here without starting it (the lifespan, which opens stores and connections, never runs).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import APIRouter, FastAPI
from prometheus_client import CollectorRegistry

from tidemq_server.broker.app import create_broker_app
from tidemq_server.broker.settings import BrokerSettings
from tidemq_server.checker.app import create_checker_app
from tidemq_server.checker.settings import CheckerSettings
from tidemq_server.common.app import create_app
from tidemq_server.metrics.settings import MetricsSettings
from tidemq_server.metrics.sidecar import create_sidecar_app
from tidemq_server.nameserver.app import build_app
from tidemq_server.nameserver.settings import NameserverSettings
from tidemq_server.scheduler.app import create_scheduler_app
from tidemq_server.scheduler.settings import SchedulerSettings

APPS: dict[str, Callable[[Path], FastAPI]] = {
    "nameserver": lambda _: build_app(NameserverSettings()),
    "broker": lambda d: create_broker_app(BrokerSettings(data_dir=d)),
    "checker": lambda _: create_checker_app(CheckerSettings()),
    "scheduler": lambda d: create_scheduler_app(SchedulerSettings(data_dir=d)),
    "metrics": lambda d: create_sidecar_app(MetricsSettings(data_dir=d, run_job=False)),
}


def flat_routes(routes: Iterable[Any]) -> Iterator[Any]:
    """Every route of an app, those of its included routers too (FastAPI includes a router as
    one entry of ``app.routes`` and resolves its routes when serving)."""
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:  # a FastAPI that copies an included router's routes into app.routes
        yield from routes
        return
    yield from iter_route_contexts(list(routes))


def duplicates(app: FastAPI) -> list[tuple[str, str]]:
    """Every (method, path) that more than one route of ``app`` answers."""
    seen: Counter[tuple[str, str]] = Counter()
    for route in flat_routes(app.routes):
        path = getattr(route, "path", None)
        if path is None:
            continue
        methods = getattr(route, "methods", None) or {"*"}  # a mount or a websocket route
        seen.update((method, path) for method in methods)
    return sorted(key for key, count in seen.items() if count > 1)


@pytest.mark.parametrize("service", sorted(APPS))
def test_no_two_routes_share_a_method_and_path(service: str, tmp_path: Path) -> None:
    app = APPS[service](tmp_path)
    paths = {getattr(route, "path", None) for route in flat_routes(app.routes)}
    assert {"/healthz", "/metrics"} <= paths, "the app was built without its routes"
    assert duplicates(app) == []


def test_the_broker_routes_of_included_routers_are_seen(tmp_path: Path) -> None:
    paths = {getattr(route, "path", None) for route in flat_routes(APPS["broker"](tmp_path).routes)}
    assert {"/v1/producers/{group}/heartbeat", "/v1/groups/{group}/heartbeat"} <= paths


def test_a_duplicate_route_is_found() -> None:
    app = create_app("dup", CollectorRegistry())

    @app.post("/v1/things/{name}")
    async def first(name: str) -> dict[str, str]:
        return {"first": name}

    router = APIRouter()

    @router.api_route("/v1/things/{name}", methods=["GET", "POST"])
    async def second(name: str) -> dict[str, str]:
        return {"second": name}

    app.include_router(router)
    assert duplicates(app) == [("POST", "/v1/things/{name}")]
