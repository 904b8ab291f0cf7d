"""What the nameserver answers (docs/api.md "Nameserver"), as models for the OpenAPI document.

Documentation only: the routes answer plain dicts through ``reply`` (JSON or msgpack).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

Perm = Literal["r", "w", "rw"]


class RouteQueue(BaseModel):
    broker_name: str
    address: str = Field(description="the broker's base URL")
    queues: int
    perm: Perm


class Routes(BaseModel):
    topic: str
    queues: list[RouteQueue] = Field(description="one entry per live broker serving the topic")


class TopicQueues(BaseModel):
    queues: int
    perm: Perm


class BrokerState(BaseModel):
    cluster: str
    broker_name: str
    address: str
    last_heartbeat_ms: int
    topics: dict[str, TopicQueues]


class Cluster(BaseModel):
    brokers: list[BrokerState]
