"""What every RPC handler of the gRPC front door reaches: the broker, the sessions, the settings.

Handlers are plain functions of (``Door``, request, context); ``servicer.py`` only dispatches.
They call the same service objects the REST routes call (``broker.sender``,
``broker.consumers``, ``broker.retries``, ...), so each semantic has one implementation.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

import grpc

from tidemq_server.broker.grpc.errors import RpcRefused
from tidemq_server.broker.grpc.proto import Code, pb
from tidemq_server.broker.grpc.sessions import ServerSide, Sessions
from tidemq_server.broker.messaging.convert import born_host
from tidemq_server.broker.service import Broker
from tidemq_server.common.discovery import ClusterView

CLIENT_ID_HEADER = "x-mq-client-id"


@dataclass(slots=True)
class Door:
    broker: Broker
    sessions: Sessions
    side: ServerSide
    host: str  # advertised in routes
    port: int
    invisible_ms: int  # for receives that name none (push consumers)
    closing: bool = False
    swept_at: float = 0.0  # sessions.clock() of the last sweep of silent sessions
    cluster: ClusterView | None = None  # every broker group (nameservers); None: this one only

    def endpoints(self) -> Any:
        """The ``Endpoints`` clients reach this broker's gRPC front door at."""
        return endpoints_of(self.host, self.port)

    def require_own(self, queue: Any) -> None:
        """Refuse a request naming a queue of another broker group (ILLEGAL_ACCESS_POINT):
        each group's door serves its own queues; the route names every queue's door."""
        owner = queue.broker.name
        own = self.broker.settings.broker_name
        if owner and owner != own:
            raise RpcRefused(Code.ILLEGAL_ACCESS_POINT,
                             f"this is the gRPC door of broker {own!r}; queues of broker "
                             f"{owner!r} are served at the endpoint its route names")


def endpoints_of(host: str, port: int) -> Any:
    """The ``Endpoints`` of one gRPC front door."""
    out = pb.Endpoints(scheme=address_scheme(host))
    out.addresses.add(host=host, port=port)
    return out


def address_scheme(host: str) -> int:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return int(pb.AddressScheme.DOMAIN_NAME)
    return int(pb.AddressScheme.IPv4 if ip.version == 4 else pb.AddressScheme.IPv6)


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (or ``[v6]:port``) → (host, port)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"grpc address {address!r} must be host:port")
    return host.strip("[]"), int(port)


def client_id_of(context: grpc.aio.ServicerContext, required: bool = True) -> str:
    """The caller's ``x-mq-client-id``; CLIENT_ID_REQUIRED when missing and required."""
    for item in context.invocation_metadata() or ():
        if item.key == CLIENT_ID_HEADER and item.value:
            return str(item.value)
    if required:
        raise RpcRefused(Code.CLIENT_ID_REQUIRED,
                         f"the {CLIENT_ID_HEADER} header is required on this call")
    return ""


def peer_host(context: grpc.aio.ServicerContext) -> str:
    """The caller as ``ip:port`` for the stored record (``0.0.0.0:0`` when not IPv4)."""
    peer = context.peer() or ""  # "ipv4:127.0.0.1:5432", "ipv6:[::1]:5432", "unix:..."
    if not peer.startswith("ipv4:"):
        return born_host(None, None)
    host, _, port = peer[5:].rpartition(":")
    return born_host(host, int(port) if port.isdigit() else 0)
