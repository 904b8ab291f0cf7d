"""The values an election keeps in etcd and the fence it moves (replication/election.py).

``GroupKeys`` names a group's keys under ``KEY_ROOT``; ``Claim`` is the value of ``primary`` and
of each ``members/<id>``; ``best_member`` picks who should lead among the claims; ``LeaseFence``
is the write fence the elector opens and shuts and the broker's role asks before every
acknowledgement.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidemq_server.common.etcd import KeyValue

log = logging.getLogger(__name__)

KEY_ROOT = "/tidemq"  # every tidemq key in etcd starts with this


@dataclass(frozen=True, slots=True)
class GroupKeys:
    cluster: str
    broker_name: str

    @property
    def prefix(self) -> str:
        return f"{KEY_ROOT}/{self.cluster}/{self.broker_name}/"

    @property
    def primary(self) -> str:
        return self.prefix + "primary"

    @property
    def epoch(self) -> str:
        return self.prefix + "epoch"

    @property
    def members(self) -> str:
        return self.prefix + "members/"

    def member(self, broker_id: int) -> str:
        return f"{self.members}{broker_id}"


@dataclass(frozen=True, slots=True)
class Claim:
    """A ``primary`` or ``members/<id>`` value. ``aside``/``acked`` (a member standing aside,
    and its high-water mark then) are written only when set: older values read as not aside."""

    broker_id: int
    address: str
    epoch: int
    last_offset: int = 0
    aside: bool = False
    acked: int = 0

    def encode(self) -> bytes:
        value: dict[str, object] = {"broker_id": self.broker_id, "address": self.address,
                                    "epoch": self.epoch, "last_offset": self.last_offset}
        if self.aside:
            value.update(aside=True, acked=self.acked)
        return json.dumps(value).encode()

    @staticmethod
    def decode(kv: KeyValue) -> Claim | None:
        try:
            raw: Any = json.loads(kv.value)
            return Claim(int(raw["broker_id"]), str(raw["address"]), int(raw["epoch"]),
                         int(raw.get("last_offset", 0)), bool(raw.get("aside", False)),
                         int(raw.get("acked", 0)))
        except (ValueError, KeyError, TypeError):
            log.error("unreadable election value at %s: %r", kv.key, kv.value[:200])
            return None


class LeaseFence:
    """The write fence of a broker led through etcd: open while it leads and until
    ``deadline`` (monotonic clock). Its ``Elector`` moves it; the role only asks it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.leading = False
        self.deadline = 0.0  # clock() after which the lease may have expired in etcd

    def __call__(self) -> bool:
        """May this broker acknowledge a write now? (leads, and its lease is surely alive)"""
        return self.leading and self.clock() < self.deadline

    def lead(self) -> None:
        self.leading = True

    def lose(self) -> None:
        self.leading = False

    def hold_until(self, deadline: float) -> None:
        self.deadline = deadline



def best_member(members: list[Claim]) -> Claim | None:
    """The member that should lead: the largest offset, then the lowest broker id, among those
    not standing aside; None when that one lacks bytes a member standing aside may have
    acknowledged (below its ``acked``): then nobody runs until that member does again."""
    running = [m for m in members if not m.aside]
    best = max(running, key=lambda m: (m.last_offset, -m.broker_id), default=None)
    floor = max((m.acked for m in members if m.aside), default=0)
    return best if best is not None and best.last_offset >= floor else None
