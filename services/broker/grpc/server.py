"""The gRPC server of the broker process: grpcio's asyncio server on the broker's event loop.

``GrpcFrontDoor.start`` binds ``grpc_port`` (SO_REUSEPORT off: a second broker on the same
port must fail, not share it). When the port is busy, a port given explicitly
(``TIDEMQ_BROKER_GRPC_PORT``) fails the broker's start; the default port only logs an error and
the broker serves REST alone, so that several brokers on one host (tests, a laptop) still
start. ``close`` ends Telemetry streams and held receives first, then stops the server.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from prometheus_client import Counter

from tidemq_server.broker.grpc import otlp
from tidemq_server.broker.grpc.auth import GrpcGuard
from tidemq_server.broker.grpc.door import Door, split_address
from tidemq_server.broker.grpc.proto import SERVICE_NAME, service_grpc
from tidemq_server.broker.grpc.servicer import MessagingServicer
from tidemq_server.broker.grpc.sessions import ServerSide, Sessions
from tidemq_server.broker.grpc.telemetry import CLOSE
from tidemq_server.broker.observability import GRPC_STATS
from tidemq_server.broker.service import Broker
from tidemq_server.broker.settings import BrokerSettings
from tidemq_server.common.auth import Gate
from tidemq_server.common.constants import GRPC_ROUTE_CACHE_S
from tidemq_server.common.discovery import ClusterView

log = logging.getLogger(__name__)

STOP_GRACE_S = 2.0  # in-flight RPCs get this long to finish on shutdown
KEEPALIVE_OPTIONS = [
    ("grpc.so_reuseport", 0),
    ("grpc.keepalive_time_ms", 60_000),  # ping idle clients (Telemetry streams) every minute
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),  # clients may ping every 5 s
    ("grpc.keepalive_permit_without_calls", 1),
]


class _CountCalls(grpc.aio.ServerInterceptor):
    """Counts every call by RPC name (``tidemq_broker_grpc_requests_total``)."""

    def __init__(self, counter: Counter) -> None:
        self.counter = counter

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]],
                                handler_call_details: Any) -> Any:
        self.counter.labels(handler_call_details.method.rsplit("/", 1)[-1]).inc()
        return await continuation(handler_call_details)


class GrpcFrontDoor:
    """Serves ``apache.rocketmq.v2.MessagingService`` for one broker."""

    def __init__(self, broker: Broker, settings: BrokerSettings, gate: Gate | None = None,
                 ) -> None:
        self.broker = broker
        self.guard = GrpcGuard(gate) if gate is not None else None  # ACL on
        self.settings = settings
        self.server: grpc.aio.Server | None = None
        self.port = 0
        host, port = split_address(settings.grpc_address)
        self.door = Door(
            broker=broker,
            sessions=Sessions(expiry_s=2 * settings.consumer_expiry_s),
            side=ServerSide(max_body_bytes=settings.max_body_bytes,
                            max_reconsume_times=settings.max_reconsume_times,
                            long_polling_ms=min(settings.grpc_long_polling_ms,
                                                settings.long_poll_max_ms)),
            host=host, port=port, invisible_ms=settings.grpc_invisible_ms,
            # routes list every group the nameservers know
            cluster=ClusterView(settings.nameserver_urls, wait_fresh=True,
                                refresh_s=GRPC_ROUTE_CACHE_S)
            if settings.nameserver_urls else None)

    @property
    def enabled(self) -> bool:
        return self.settings.grpc_enabled and self.settings.grpc_port != 0

    async def start(self) -> None:
        s = self.settings
        if not self.enabled:
            log.info("gRPC front door off (grpc_enabled=%s, grpc_port=%d)", s.grpc_enabled,
                     s.grpc_port)
            return
        limit = s.max_batch_bytes + 4 * 1024 * 1024
        calls = Counter("tidemq_broker_grpc_requests", "gRPC calls by RPC (RocketMQ 5 clients)",
                        ["rpc"], registry=self.broker.metrics.registry)
        server = grpc.aio.server(interceptors=[_CountCalls(calls)],
                                 options=[*KEEPALIVE_OPTIONS,
                                          ("grpc.max_receive_message_length", limit),
                                          ("grpc.max_send_message_length", -1)])
        servicer = MessagingServicer(self.door, self.guard)
        service_grpc.add_MessagingServiceServicer_to_server(servicer, server)
        otlp.serve(server, self.broker.metrics.registry)  # the clients' own metrics
        bind = f"[{s.host}]:{s.grpc_port}" if ":" in s.host else f"{s.host}:{s.grpc_port}"
        tls = s.server_tls()
        try:
            if tls is None:
                self.port = server.add_insecure_port(bind)
            else:  # the REST port's certificate and key
                self.port = server.add_secure_port(bind, tls.grpc_credentials())
        except RuntimeError as exc:
            if "grpc_port" in s.model_fields_set:
                raise RuntimeError(f"gRPC front door cannot listen on {bind}: {exc}; set "
                                   "TIDEMQ_BROKER_GRPC_PORT to a free port (0 = off)") from exc
            log.error("gRPC front door OFF: cannot listen on %s (%s); set "
                      "TIDEMQ_BROKER_GRPC_PORT to a free port to serve RocketMQ clients",
                      bind, exc)
            return
        await server.start()
        self.server = server
        if tls is None:  # clients export their metrics here (plaintext only: grpc/otlp.py)
            self.door.side = dataclasses.replace(self.door.side,
                                                 metric_endpoints=self.door.endpoints())
        self.broker.metrics.add_stats("tidemq_broker_grpc_", self.stats, GRPC_STATS,
                                      "gRPC front door")
        log.info("gRPC front door (%s) listening on %s%s, advertised as %s:%d", SERVICE_NAME,
                 bind, " (TLS)" if tls is not None else "", self.door.host, self.door.port)

    def stats(self) -> dict[str, float]:
        sessions = self.door.sessions.all()
        return {
            "sessions": float(len(sessions)),
            "telemetry_streams": float(sum(1 for x in sessions if x.outbox is not None)),
            "check_pumps": float(sum(len(x.pumps) for x in sessions)),
        }

    def begin_shutdown(self) -> None:
        """End every Telemetry stream and answer held receives (SIGTERM)."""
        self.door.closing = True
        for session in list(self.door.sessions.all()):
            if session.outbox is not None:
                session.outbox.put_nowait(CLOSE)

    async def close(self) -> None:
        if self.door.cluster is not None:
            await self.door.cluster.close()
            self.door.cluster = None
        if self.server is None:
            return
        self.begin_shutdown()
        await self.server.stop(STOP_GRACE_S)
        self.server = None
        log.info("gRPC front door stopped")
