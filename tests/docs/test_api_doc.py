"""docs/api.md against the services' own OpenAPI: every endpoint the page describes exists in
the service it is described under, every endpoint a service serves is described, and every
``METHOD /path`` named anywhere in the docs or the README is a real endpoint.

An endpoint is described by a heading ``#### `METHOD /path` ``; its service is the one whose
default port appears in the nearest heading above it that names a port (``## Broker (port
10911)``), or every service under ``## Every service (any port)``. Apps are built, not started:
``app.openapi()`` needs no lifespan.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi import FastAPI

from tests.support.procs import REPO
from tidemq_server.common.constants import (
    BROKER_PORT,
    CHECKER_PORT,
    CONSOLE_PORT,
    METRICS_PORT,
    NAMESERVER_PORT,
    SCHEDULER_PORT,
)

API_DOC = REPO / "docs" / "api.md"
PROSE = [API_DOC, REPO / "docs" / "architecture.md", REPO / "docs" / "operations.md",
         REPO / "README.md"]

METHODS = "GET|POST|PUT|DELETE|PATCH"
ENDPOINT_HEADING = re.compile(rf"^#+ `({METHODS}) (/[^`\s]*)`\s*$")
PORT_HEADING = re.compile(r"^#+ .*\((?:port (\d+)|any port)\)\s*$")
MENTION = re.compile(rf"\b({METHODS}) (/[\w{{}}/%.-]*)")

Endpoint = tuple[str, str]  # (METHOD, OpenAPI path template)
SERVICE_OF_PORT = {NAMESERVER_PORT: "nameserver", BROKER_PORT: "broker",
                   CHECKER_PORT: "checker", SCHEDULER_PORT: "scheduler",
                   METRICS_PORT: "metrics", CONSOLE_PORT: "console"}
EVERY = "every service"


def _nameserver() -> FastAPI:
    from tidemq_server.nameserver.app import build_app
    from tidemq_server.nameserver.settings import NameserverSettings
    return build_app(NameserverSettings())


def _broker() -> FastAPI:
    from tidemq_server.broker.app import create_broker_app
    from tidemq_server.broker.settings import BrokerSettings
    return create_broker_app(BrokerSettings())


def _checker() -> FastAPI:
    from tidemq_server.checker.app import create_checker_app
    from tidemq_server.checker.settings import CheckerSettings
    return create_checker_app(CheckerSettings())


def _scheduler() -> FastAPI:
    from tidemq_server.scheduler.app import create_scheduler_app
    from tidemq_server.scheduler.settings import SchedulerSettings
    return create_scheduler_app(SchedulerSettings())


def _metrics() -> FastAPI:
    from tidemq_server.metrics.settings import MetricsSettings
    from tidemq_server.metrics.sidecar import create_sidecar_app
    return create_sidecar_app(MetricsSettings())


def _console() -> FastAPI:  # its HTML pages stay out of the OpenAPI: /healthz, /metrics
    from tidemq_server.console.app import create_console_app
    from tidemq_server.console.settings import ConsoleSettings
    return create_console_app(ConsoleSettings())


BUILDERS: dict[str, Callable[[], FastAPI]] = {
    "nameserver": _nameserver, "broker": _broker, "checker": _checker,
    "scheduler": _scheduler, "metrics": _metrics, "console": _console,
}


@pytest.fixture(scope="module")
def served() -> dict[str, set[Endpoint]]:
    """Service → the endpoints in its OpenAPI."""
    out: dict[str, set[Endpoint]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # FastAPI's duplicate operation id notice
        for name, build in BUILDERS.items():
            paths = build().openapi()["paths"]
            out[name] = {(method.upper(), path) for path, ops in paths.items() for method in ops}
    return out


def documented(text: str) -> list[tuple[str, Endpoint, int]]:
    """(service, endpoint, line number) of every endpoint heading of ``text``."""
    found = []
    service: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        port = PORT_HEADING.match(line)
        if port:
            service = EVERY if port.group(1) is None else SERVICE_OF_PORT[int(port.group(1))]
            continue
        heading = ENDPOINT_HEADING.match(line)
        if heading:
            assert service is not None, f"api.md:{number}: endpoint before any service heading"
            found.append((service, (heading.group(1), heading.group(2)), number))
    return found


def test_ports_in_headings_are_the_services_defaults() -> None:
    ports = {int(m.group(1)) for line in API_DOC.read_text().splitlines()
             if (m := PORT_HEADING.match(line)) and m.group(1)}
    assert ports == set(SERVICE_OF_PORT)


def test_every_documented_endpoint_exists_in_its_service(served: dict[str, set[Endpoint]]
                                                         ) -> None:
    wrong = []
    for service, endpoint, number in documented(API_DOC.read_text()):
        services = list(served) if service == EVERY else [service]
        for name in services:
            if endpoint not in served[name]:
                wrong.append(f"api.md:{number}: {' '.join(endpoint)} is not served by {name}")
    assert not wrong, "\n".join(wrong)


def test_every_served_endpoint_is_documented_once(served: dict[str, set[Endpoint]]) -> None:
    entries = documented(API_DOC.read_text())
    seen: dict[tuple[str, Endpoint], int] = {}
    twice = []
    for service, endpoint, number in entries:
        key = (service, endpoint)
        if key in seen:
            twice.append(f"api.md:{number}: {' '.join(endpoint)} already described at "
                         f"line {seen[key]}")
        seen[key] = number
    assert not twice, "\n".join(twice)
    everywhere = {e for s, e, _ in entries if s == EVERY}
    missing = [f"{name}: {' '.join(e)}" for name, endpoints in served.items()
               for e in sorted(endpoints)
               if e not in everywhere and (name, e) not in seen]
    assert not missing, "endpoints not described in docs/api.md:\n" + "\n".join(missing)


@pytest.mark.parametrize("doc", PROSE, ids=lambda p: p.name)
def test_every_endpoint_named_in_the_docs_exists(doc: Path,
                                                 served: dict[str, set[Endpoint]]) -> None:
    every = set().union(*served.values())
    text = doc.read_text()
    named = {(m.group(1), m.group(2).rstrip(".")) for m in MENTION.finditer(text)}
    assert named, f"{doc.name} names no endpoint"
    unknown = sorted(e for e in named if e not in every)
    assert not unknown, f"{doc.name} names endpoints no service serves: {unknown}"
