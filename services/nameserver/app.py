"""The nameserver's HTTP API (docs/api.md, "Nameserver"): broker heartbeats in, topic routes out.

Thin routes over ``BrokerRegistry``; an ``ExpiryLoop`` sweeps silent brokers in the background.
Its state is memory only: after a start, until every broker group it knows of has registered
again (``warmup.py``; ``warmup_s`` at most), an unknown topic answers 503 UNAVAILABLE (retriable)
rather than 404 TOPIC_NOT_FOUND, which clients would take for a deleted topic.
Registering and deregistering a broker rewrites every client's routes, so both take the cluster
token (``X-Tidemq-Token``, 401 UNAUTHORIZED without it); reading routes stays open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Literal

from fastapi import Depends, FastAPI, Query, Request, Response
from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator
from tidemq.protocol import ErrorCode, ProtocolError, validate_topic_name

from tidemq_server.common.app import create_app, error_response, reply, token_guard
from tidemq_server.common.auth import service_gate
from tidemq_server.common.bodies import body_doc, read_model
from tidemq_server.common.constants import MAX_BROKER_ID
from tidemq_server.common.loop import BackgroundLoop
from tidemq_server.common.openapi import TOPIC_RULE, Empty, TopicName, errors
from tidemq_server.nameserver.answers import Cluster, Routes
from tidemq_server.nameserver.registry import BrokerRegistry, TopicInfo
from tidemq_server.nameserver.settings import NameserverSettings
from tidemq_server.nameserver.warmup import WarmUp, ask_peers

log = logging.getLogger(__name__)

MAX_QUEUES = 65_535  # upper bound on a topic's queue count in a heartbeat
ADDRESS_RE = re.compile(r"^https?://[^\s/]+(/\S*)?$")
GRPC_ADDRESS_RE = re.compile(r"^[^\s/:]+:\d{1,5}$|^\[[0-9A-Fa-f:.]+\]:\d{1,5}$")


class BrokerTopicBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    queues: StrictInt = Field(ge=1, le=MAX_QUEUES)
    perm: Literal["r", "w", "rw"]


class BrokerHeartbeatBody(BaseModel):
    """``POST /v1/brokers/heartbeat``: the broker's full current state (replaces the last one)."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    cluster: str = Field(min_length=1, max_length=255)
    broker_name: str = Field(min_length=1, max_length=255)
    address: str = Field(max_length=1024,
                         description="base URL clients use, e.g. http://127.0.0.1:10911")
    topics: dict[str, BrokerTopicBody] = Field(json_schema_extra={"propertyNames": TOPIC_RULE})
    # cluster fields (additive: a heartbeat without them is a group's only member, primary)
    broker_id: StrictInt = Field(0, ge=0, le=MAX_BROKER_ID,
                                 description="member of the group (0 while primary)")
    role: Literal["primary", "replica"] = "primary"
    epoch: StrictInt = Field(0, ge=0, description="the group's leadership term")
    grpc_address: str | None = Field(None, max_length=1024,
                                     description="host:port of its gRPC door, null when none")
    max_offset: StrictInt = Field(0, ge=0, description="commit log max physical offset (bytes)")
    internal_address: str | None = Field(
        None, max_length=1024, description="base URL the deployment's own services use, when "
        "not ``address`` (e.g. a container name, while ``address`` is a published port)")

    @field_validator("grpc_address")
    @classmethod
    def _grpc_address(cls, address: str | None) -> str | None:
        if address is not None and not GRPC_ADDRESS_RE.match(address):
            raise ValueError(f"{address!r} is not host:port (like 127.0.0.1:8081)")
        return address

    @field_validator("internal_address")
    @classmethod
    def _internal_address(cls, address: str | None) -> str | None:
        return None if address is None else cls._address(address)

    @field_validator("address")
    @classmethod
    def _address(cls, address: str) -> str:
        if not ADDRESS_RE.match(address):
            raise ValueError(f"{address!r} is not the broker's base URL "
                             "(like http://127.0.0.1:10911)")
        return address.rstrip("/")

    @field_validator("topics")
    @classmethod
    def _topic_names(cls, topics: dict[str, BrokerTopicBody]) -> dict[str, BrokerTopicBody]:
        for name in topics:
            try:
                validate_topic_name(name)
            except ProtocolError as exc:
                raise ValueError(exc.message) from None
        return topics


class Metrics:
    """The nameserver's Prometheus metrics, on a registry of its own."""

    def __init__(self, brokers: BrokerRegistry) -> None:
        self.registry = CollectorRegistry()
        Gauge("tidemq_nameserver_brokers", "Live brokers registered with this nameserver",
              registry=self.registry).set_function(lambda: len(brokers))
        Gauge("tidemq_nameserver_topics", "Topics served by at least one live broker",
              registry=self.registry).set_function(lambda: len(brokers.topics()))
        self.heartbeats = Counter("tidemq_nameserver_heartbeats",
                                  "Broker heartbeats accepted", registry=self.registry)
        self.route_lookups = Counter("tidemq_nameserver_route_lookups",
                                     "Route lookups by outcome (found, not_found, warming_up)",
                                     ["result"], registry=self.registry)
        self.expired = Counter("tidemq_nameserver_brokers_expired",
                               "Brokers dropped after missing heartbeats", registry=self.registry)
        for result in ("found", "not_found", "warming_up"):
            self.route_lookups.labels(result)


class ExpiryLoop(BackgroundLoop):
    """Removes brokers that stopped heartbeating."""

    name = "nameserver-expiry"

    def __init__(self, brokers: BrokerRegistry, metrics: Metrics, interval_s: float) -> None:
        super().__init__(interval_s)
        self.brokers = brokers
        self.metrics = metrics

    async def run_once(self) -> None:
        expired = self.brokers.expire()
        if expired:
            self.metrics.expired.inc(len(expired))


def warming_up(topic: str, age_s: float, warmup_s: float) -> Response:
    """503 UNAVAILABLE for a topic no broker has (re-)registered yet this soon after start."""
    return error_response(
        ErrorCode.UNAVAILABLE,
        f"no live broker serves topic {topic!r} yet, but this nameserver started {age_s:.0f} s "
        f"ago and brokers re-register within {warmup_s:.0f} s: retry",
        {"Retry-After": str(max(1, math.ceil(warmup_s - age_s)))})


def build_app(settings: NameserverSettings, brokers: BrokerRegistry | None = None) -> FastAPI:
    brokers = brokers or BrokerRegistry(expiry_ms=int(settings.broker_expiry_s * 1000))
    metrics = Metrics(brokers)
    gate = service_gate(settings, metrics.registry)
    expiry = ExpiryLoop(brokers, metrics, settings.expiry_check_interval_s)
    warm = WarmUp(settings.warmup_s, settings.expected_groups)

    def warming() -> bool:
        return warm.warming({b.broker_name for b in brokers.brokers() if b.role == "primary"})

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if not settings.token:
            log.warning("no cluster token set (TIDEMQ_NAMESRV_TOKEN): any local process can "
                        "register or remove brokers")
        expiry.start()
        warm.restart()  # the warm-up counts from here
        peers = asyncio.create_task(ask_peers(warm, settings.peer_urls), name="warmup-peers")
        log.info("nameserver ready on %s:%d (broker expiry %.1f s, swept every %.1f s, "
                 "warm-up %.1f s)", settings.host, settings.port, settings.broker_expiry_s,
                 settings.expiry_check_interval_s, settings.warmup_s)
        try:
            yield
        finally:
            peers.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await peers
            await expiry.stop()
            log.info("nameserver stopped")

    app = create_app("tidemq nameserver", metrics.registry, lifespan, gate=gate)
    app.state.brokers = brokers

    # checked before the body is read: no token, no registration (401 UNAUTHORIZED)
    cluster_token = token_guard(lambda _: settings.token)

    @app.post("/v1/brokers/heartbeat", tags=["brokers"], dependencies=[Depends(cluster_token)],
              openapi_extra=body_doc(BrokerHeartbeatBody), response_model=Empty)
    async def heartbeat(request: Request) -> Response:
        """Register a broker or refresh it; its topic set becomes exactly ``topics``.
        Needs the cluster token."""
        body = await read_model(request, BrokerHeartbeatBody)
        topics = {name: TopicInfo(queues=t.queues, perm=t.perm) for name, t in body.topics.items()}
        brokers.heartbeat(body.cluster, body.broker_name, body.address, topics,
                          broker_id=body.broker_id, role=body.role, epoch=body.epoch,
                          grpc_address=body.grpc_address, max_offset=body.max_offset,
                          internal_address=body.internal_address)
        metrics.heartbeats.inc()
        return reply(request, {})

    @app.delete("/v1/brokers/{broker_name}", tags=["brokers"],
                dependencies=[Depends(cluster_token)], response_model=Empty,
                responses=errors(ErrorCode.BROKER_NOT_FOUND))
    async def unregister(
        request: Request,
        broker_name: str,
        address: Annotated[str | None, Query(description="only if still at this address")] = None,
        broker_id: Annotated[int | None, Query(
            ge=0, le=MAX_BROKER_ID,
            description="only this member of the group (every member when absent)")] = None,
    ) -> Response:
        """A broker shutting down cleanly leaves the routes at once. Needs the cluster token;
        404 BROKER_NOT_FOUND when no such broker is registered (member ``broker_id`` at
        ``address``, when given)."""
        if not brokers.unregister(broker_name, address, broker_id):
            who = f"{broker_name!r}" + (f" (id {broker_id})" if broker_id is not None else "")
            where = f" at {address}" if address else ""
            raise ProtocolError(ErrorCode.BROKER_NOT_FOUND,
                                f"no broker {who} is registered{where}: it already "
                                "left, expired, or re-registered from another address")
        return reply(request, {})

    @app.get("/v1/routes/{topic}", tags=["routes"], response_model=Routes,
             responses=errors(ErrorCode.INVALID_TOPIC_NAME, ErrorCode.TOPIC_NOT_FOUND,
                              ErrorCode.UNAVAILABLE))
    async def routes(request: Request, topic: TopicName) -> Response:
        """Every group whose live primary serves ``topic``: its address, queue count,
        permission and readable copies (``replicas``). A topic no live broker serves is
        404 TOPIC_NOT_FOUND, or 503 UNAVAILABLE with Retry-After during the warm-up after
        start, while a broker group it knows of has not registered yet (TIDEMQ_NAMESRV_WARMUP_S
        at most)."""
        validate_topic_name(topic)
        queues = brokers.routes(topic)
        if not queues and warming():
            metrics.route_lookups.labels("warming_up").inc()
            return warming_up(topic, warm.age_s(), settings.warmup_s)
        if not queues:
            metrics.route_lookups.labels("not_found").inc()
            raise ProtocolError(ErrorCode.TOPIC_NOT_FOUND,
                                f"no live broker serves topic {topic!r}: create it on a broker "
                                f"(PUT /v1/topics/{topic}) and retry")
        metrics.route_lookups.labels("found").inc()
        return reply(request, {"topic": topic, "queues": [q.to_wire() for q in queues]})

    @app.get("/v1/cluster", tags=["routes"], response_model=Cluster)
    async def cluster(request: Request) -> Response:
        """Every live broker with its role, addresses, last heartbeat and topics, and every
        nameserver of the cluster (TIDEMQ_NAMESRV_PEERS); ``warming_up`` while this nameserver
        may not know every broker yet (a starting peer does not trust its view then)."""
        return reply(request, {"brokers": [b.to_wire() for b in brokers.brokers()],
                               "nameservers": settings.peer_urls, "warming_up": warming()})

    return app
