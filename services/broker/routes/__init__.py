"""The broker's HTTP routes, one module per endpoint group; each calls the service layer."""

from __future__ import annotations

from fastapi import APIRouter

from tidemq_server.broker.routes import (
    delays,
    groups,
    inspect,
    internal,
    internal_bodies,
    messages,
    query,
    replication,
    topics,
    transactions,
    transactions_internal,
)

ROUTERS: list[APIRouter] = [
    topics.router, messages.router, groups.router, query.router, internal.router,
    internal_bodies.router, inspect.router,
    transactions.router, transactions_internal.router, delays.router, delays.internal,
    replication.router,
]

__all__ = ["ROUTERS"]
