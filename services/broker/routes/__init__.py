"""The broker's HTTP routes, one module per endpoint group; each calls the service layer."""

from __future__ import annotations

from fastapi import APIRouter

from services.broker.routes import (
    groups,
    internal,
    internal_bodies,
    messages,
    query,
    scheduling,
    topics,
    transactions,
    tx_internal,
)

ROUTERS: list[APIRouter] = [
    topics.router, messages.router, groups.router, query.router, internal.router,
    internal_bodies.router,
    transactions.router, tx_internal.router, scheduling.router, scheduling.internal,
]

__all__ = ["ROUTERS"]
