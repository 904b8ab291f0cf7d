"""Answer models that more than one service publishes in its OpenAPI document.

Documentation only, like each service's own answer models: routes answer plain dicts through
``reply``, and these are their ``response_model``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

#: A topic's permission as answers spell it (the broker's topics, the nameserver's routes).
Perm = Literal["rw", "r", "w"]


class Scheduled(BaseModel):
    """Pending delayed messages: the scheduler counts them, the broker passes the count on."""

    pending: int
    next_due_ms: int | None
    by_level: dict[str, int] = Field(description="delay level → waiting messages")
    timers: int = Field(description="messages with delay_ms or deliver_at_ms")


class HistogramBucket(BaseModel):
    start_ms: int = Field(description="start of the hour or day (UTC, epoch ms)")
    count: int


class Histogram(BaseModel):
    """Pending timers by due time: the scheduler counts them, the broker passes them on."""

    by: Literal["hour", "day"]
    width_ms: int
    buckets: list[HistogramBucket] = Field(description="earliest first; empty ones left out")
    timers: int = Field(description="timers counted (those the scheduler has taken in)")
