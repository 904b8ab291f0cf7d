"""The broker's HTTP routes, one module per endpoint group; each calls the service layer."""

from __future__ import annotations

from fastapi import APIRouter

from services.broker.routes import groups, internal, messages, query, topics

ROUTERS: list[APIRouter] = [
    topics.router, messages.router, groups.router, query.router, internal.router,
]

__all__ = ["ROUTERS"]
