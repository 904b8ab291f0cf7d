"""What the nameserver answers (docs/api.md "Nameserver"), as models for the OpenAPI document.

Documentation only: the routes answer plain dicts through ``reply`` (JSON or msgpack).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from tidemq_server.common.answers import Perm


class RouteQueue(BaseModel):
    broker_name: str
    address: str = Field(description="the broker's base URL")
    queues: int
    perm: Perm
    replicas: list[str] = Field(description="base URLs of the group's readable copies "
                                "(empty without replication)")


class Routes(BaseModel):
    topic: str
    queues: list[RouteQueue] = Field(description="one entry per live broker serving the topic")


class TopicQueues(BaseModel):
    queues: int
    perm: Perm


class BrokerState(BaseModel):
    cluster: str
    broker_name: str = Field(description="the broker group")
    broker_id: int = Field(description="member of the group (0 while primary)")
    role: Literal["primary", "replica"]
    epoch: int = Field(description="the group's leadership term (0 without replication)")
    address: str = Field(description="the base URL clients use")
    internal_address: str | None = Field(description="the base URL the deployment's own "
                                         "services use, or null when it is ``address``")
    grpc_address: str | None = Field(description="host:port of its gRPC door, or null")
    max_offset: int = Field(description="commit log max physical offset at the last "
                            "heartbeat (bytes)")
    last_heartbeat_ms: int
    topics: dict[str, TopicQueues]


class Cluster(BaseModel):
    brokers: list[BrokerState]
    nameservers: list[str] = Field(description="base URLs of every nameserver of the cluster "
                                   "(TIDEMQ_NAMESRV_PEERS)")
    warming_up: bool = Field(False, description="this nameserver started moments ago and may "
                             "not know every broker yet: an unknown topic answers 503, not 404")
