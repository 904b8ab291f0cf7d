"""What every broker route shares: reaching the Broker, reading bodies in JSON or msgpack.

Bodies are read by hand (tidemq_server.common.bodies, re-exported here) so that msgpack works on
every endpoint and the send hot path skips pydantic; ``body_doc`` publishes each body's schema.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Path, Query, Request
from tidemq.protocol import ErrorCode

from tidemq_server.broker.messaging.convert import born_host
from tidemq_server.broker.messaging.pull import MAX_PULL, Pulled
from tidemq_server.broker.service import Broker
from tidemq_server.common.app import token_guard
from tidemq_server.common.bodies import StrictBody, body_doc, read_model, read_payload, read_raw
from tidemq_server.common.constants import LONG_POLL_MAX_MS

__all__ = ["LONG_POLL_MAX_MS", "PULL_ERRORS", "Offset", "PullMax", "QueueId", "StrictBody",
           "WaitMs", "body_doc", "broker_of", "client_host", "internal_auth", "pull_answer",
           "read_model", "read_payload", "read_raw", "wants_msgpack"]


#: Parameters the pull-shaped endpoints share.
QueueId = Annotated[int, Path(ge=0, description="queue id within the topic")]
Offset = Annotated[int, Query(ge=0, description="first queue offset to read")]
WaitMs = Annotated[int, Query(ge=0, le=LONG_POLL_MAX_MS,
                              description="long poll at the end of the queue (ms)")]
PullMax = Annotated[int, Query(ge=1, le=MAX_PULL, description="messages at most")]
#: What the pull-shaped endpoints may answer besides 200 (``responses=errors(*PULL_ERRORS)``).
PULL_ERRORS = (ErrorCode.INVALID_TOPIC_NAME, ErrorCode.OFFSET_OUT_OF_RANGE,
               ErrorCode.TOPIC_NOT_FOUND)


def broker_of(request: Request) -> Broker:
    broker: Broker = request.app.state.broker
    return broker


def wants_msgpack(request: Request) -> bool:
    """True when the answer goes out as msgpack (so message bodies stay raw bytes)."""
    accept = request.headers.get("accept") or request.headers.get("content-type") or ""
    return "msgpack" in accept


def client_host(request: Request) -> str:
    client = request.client
    return _born_host(client.host, client.port) if client else _born_host(None, None)


#: ``born_host`` of a client address, remembered: a connection's requests share it and the
#: address check parses the IP text each time (a few per cent of a one-message send)
_born_host = functools.lru_cache(maxsize=4096)(born_host)


def _broker_token(request: Request) -> str:
    return broker_of(request).settings.token


#: Dependency of every ``/internal/`` router: the cluster token (ClusterToken in /docs).
internal_auth = token_guard(_broker_token)


def pull_answer(answer: Pulled, wire: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    """The body of every pull: the messages (each through ``wire``) and the queue's bounds."""
    return {
        "messages": [wire(r) for r in answer.records],
        "next_offset": answer.next_offset,
        "min_offset": answer.min_offset,
        "max_offset": answer.max_offset,
    }
