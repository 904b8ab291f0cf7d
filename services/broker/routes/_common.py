"""What every broker route shares: reaching the Broker, reading bodies in JSON or msgpack.

Bodies are read by hand (services.common.bodies, re-exported here) so that msgpack works on
every endpoint and the send hot path skips pydantic; ``body_doc`` publishes each body's schema.
"""

from __future__ import annotations

from fastapi import Request

from services.broker.messaging.convert import born_host
from services.broker.service import Broker
from services.common.app import token_guard
from services.common.bodies import StrictBody, body_doc, read_model, read_payload

__all__ = ["StrictBody", "body_doc", "broker_of", "client_host", "internal_auth", "read_model",
           "read_payload", "wants_msgpack"]


def broker_of(request: Request) -> Broker:
    broker: Broker = request.app.state.broker
    return broker


def wants_msgpack(request: Request) -> bool:
    """True when the answer goes out as msgpack (so message bodies stay raw bytes)."""
    accept = request.headers.get("accept") or request.headers.get("content-type") or ""
    return "msgpack" in accept


def client_host(request: Request) -> str:
    client = request.client
    return born_host(client.host, client.port) if client else born_host(None, None)


def _broker_token(request: Request) -> str:
    return broker_of(request).settings.token


#: Dependency of every ``/internal/`` router: the cluster token (ClusterToken in /docs).
internal_auth = token_guard(_broker_token)
