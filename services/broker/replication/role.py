"""The role seam: who this broker is in its group, and the calls that change it.

A failover controller (etcd leases, or the static settings until one runs) drives a broker
only through ``BrokerRole``:

- ``role`` ("primary" / "replica"), ``epoch`` (the group's leadership term) and
  ``primary_address`` (base URL of the group's primary, this broker's own when primary; None
  while unknown);
- ``await promote(epoch)``: a replica stops following, finishes dispatching what it holds,
  records ``epoch`` as starting at its log end and accepts writes;
- ``await demote(primary_address, epoch)``: writes stop at once; then the log is truncated back
  to where the epoch histories diverge and the broker follows ``primary_address``;
- ``last_offset()``: the end of the local commit log (pick the most caught-up replica by it);
- ``epochs``: the persisted epoch history (``EpochFile``);
- ``fence``: ``Callable[[], bool]``, "may I still acknowledge writes?", checked right before a
  write is acknowledged (default: always true); given at construction (an etcd-led broker's is
  its elector's ``LeaseFence``: lease still held);
- ``deposed``: set when a follower shows a newer epoch; a deposed primary acknowledges nothing;
- ``add_listener(callback)``: called (no arguments) after every change of role, epoch, primary
  address or deposition (registration uses it to heartbeat at once).

The replication machinery plugs into the seam through ``RoleHooks``, also given at
construction (the composition root, ``services/broker/service.py``, passes itself: it hands
each change on to replication and to the state derived from the log).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from enum import StrEnum
from typing import Protocol

from tidemq.protocol import ErrorCode, ProtocolError

from tidemq_server.broker.replication.epochs import EpochFile

log = logging.getLogger(__name__)

Fence = Callable[[], bool]


class Role(StrEnum):
    PRIMARY = "primary"
    REPLICA = "replica"


class StaleEpochError(ValueError):
    """A role change names an epoch older than the one this broker already knows."""


def always() -> bool:
    return True


class RoleHooks(Protocol):
    """What the broker does on a role change (``Broker``, through ``ReplicationManager``)."""

    async def stop_following(self) -> None:
        """Stop fetching and finish dispatching every byte already written."""

    async def start_following(self, primary_address: str) -> None:
        """Truncate what diverged from ``primary_address``'s history, then follow it."""

    async def became_primary(self) -> None:
        """Rebuild derived in-memory state (transactions, dedup, delays) from the local log."""


class _NoHooks:
    async def stop_following(self) -> None:
        return None

    async def start_following(self, primary_address: str) -> None:
        return None

    async def became_primary(self) -> None:
        return None


class BrokerRole:
    """This broker's place in its group (see the module docstring for the contract)."""

    def __init__(self, epochs: EpochFile, self_address: str, log_end: Callable[[], int],
                 role: Role = Role.PRIMARY, epoch: int = 0,
                 primary_address: str | None = None, *, fence: Fence = always,
                 hooks: RoleHooks | None = None) -> None:
        self.epochs = epochs
        self.self_address = self_address
        self._log_end = log_end
        self.role = role
        self.epoch = epoch
        self.primary_address = primary_address if role == Role.REPLICA else self_address
        self.fence = fence
        self.deposed = False
        self.hooks: RoleHooks = hooks if hooks is not None else _NoHooks()
        self._listeners: list[Callable[[], None]] = []
        self._lock = asyncio.Lock()
        self.changes = 0  # role changes since start (metrics)
        self.recopy_end = 0  # see recopy_from

    # --- reading ---------------------------------------------------------------------------
    @property
    def is_primary(self) -> bool:
        return self.role == Role.PRIMARY

    def last_offset(self) -> int:
        """End of the local commit log."""
        return self._log_end()

    def may_lead(self) -> bool:
        """False while the log is shorter than it was before damaged records were cut from it
        (``recopy_from``): leading then would drop acknowledged records the other copies hold."""
        return self._log_end() >= self.recopy_end

    def recopy_from(self, old_end: int) -> None:
        """The log was cut below ``old_end`` to copy damaged records again from the primary."""
        self.recopy_end = old_end

    def may_write(self) -> bool:
        """Primary, not deposed, and the fence allows it."""
        return self.role == Role.PRIMARY and not self.deposed and self._fence_ok()

    def _fence_ok(self) -> bool:
        try:
            return bool(self.fence())
        except Exception:
            log.exception("the write fence failed: refusing writes")
            return False

    def why_not_writable(self) -> str:
        if self.role == Role.REPLICA:
            where = self.primary_address or "unknown"
            return f"this broker is a replica (epoch {self.epoch}); the primary is {where}"
        if self.deposed:
            return (f"this broker was primary at epoch {self.epoch} but a newer epoch exists; "
                    "it accepts no write")
        return f"this broker no longer holds the primary's lease (epoch {self.epoch})"

    def require_writable(self) -> None:
        """ProtocolError NOT_PRIMARY unless ``may_write()`` (the topic table's guard)."""
        if not self.may_write():
            raise ProtocolError(ErrorCode.NOT_PRIMARY, self.why_not_writable())

    def to_wire(self) -> dict[str, object]:
        return {"role": self.role.value, "epoch": self.epoch,
                "primary_address": self.primary_address, "deposed": self.deposed,
                "last_offset": self.last_offset(), "epochs": self.epochs.to_wire()}

    def add_listener(self, callback: Callable[[], None]) -> None:
        self._listeners.append(callback)

    def _changed(self) -> None:
        self.changes += 1
        for cb in self._listeners:
            try:
                cb()
            except Exception:
                log.exception("role listener failed")

    # --- changing --------------------------------------------------------------------------
    async def promote(self, epoch: int) -> None:
        """Become the group's primary at ``epoch``: newer than any this broker knows (the
        current one when already primary: then nothing happens)."""
        async with self._lock:
            if self.role == Role.PRIMARY and epoch == self.epoch and not self.deposed:
                return
            if epoch <= self.epoch:
                raise StaleEpochError(f"cannot promote at epoch {epoch}: epoch {self.epoch} "
                                      "is already known")
            await self.hooks.stop_following()
            start = self._log_end()
            # terms learned past the bytes actually held (a fetch cut short) do not count
            await asyncio.to_thread(self.epochs.truncate, start)
            if epoch > self.epochs.last_epoch:
                await asyncio.to_thread(self.epochs.begin, epoch, start)
            self.epoch = epoch
            self.deposed = False
            self.primary_address = self.self_address
            await self.hooks.became_primary()
            self.role = Role.PRIMARY
            log.warning("promoted to primary at epoch %d, writing from offset %d", epoch, start)
        self._changed()

    async def demote(self, primary_address: str, epoch: int) -> None:
        """Stop writing now; truncate what diverged from ``primary_address``; follow it."""
        if epoch < self.epoch:
            raise StaleEpochError(f"cannot follow epoch {epoch}: epoch {self.epoch} is known")
        was = self.role
        self.role = Role.REPLICA  # at once: the gate refuses every write from here
        async with self._lock:
            if epoch < self.epoch:
                raise StaleEpochError(f"cannot follow epoch {epoch}: epoch {self.epoch} is known")
            self.epoch = epoch
            self.deposed = False
            self.primary_address = primary_address.rstrip("/")
            await self.hooks.start_following(self.primary_address)
            log.warning("%s → replica at epoch %d, following %s", was.value, epoch,
                        self.primary_address)
        self._changed()

    def depose(self, newer_epoch: int) -> None:
        """A follower knows a newer epoch: this primary is stale and must stop writing."""
        if self.role == Role.PRIMARY and not self.deposed and newer_epoch > self.epoch:
            self.deposed = True
            log.error("deposed: a follower knows epoch %d, this primary is at %d; refusing "
                      "every write", newer_epoch, self.epoch)
            self._changed()

    def learn_epoch(self, epoch: int) -> None:
        """A replica learns its primary's epoch from a fetch answer."""
        if self.role == Role.REPLICA and epoch > self.epoch:
            self.epoch = epoch
            self._changed()


def static_role(epochs: EpochFile, self_address: str, log_end: Callable[[], int],
                role_setting: str, broker_id: int, primary_address: str,
                replicated: bool = True, *, fence: Fence = always,
                hooks: RoleHooks | None = None) -> BrokerRole:
    """The role from the settings, until a controller drives it: ``role_setting`` ("primary",
    "replica", "" = primary when ``broker_id`` is 0). A static primary writes at its last
    recorded epoch, or epoch 1 on a fresh history. Without replication: a primary at epoch 0
    and no history file (nothing changes on disk). ``fence`` and ``hooks``: the role's own
    (``BrokerRole``)."""
    if not replicated:
        return BrokerRole(epochs, self_address, log_end, Role.PRIMARY, 0, fence=fence,
                          hooks=hooks)
    epochs.load()
    role = Role(role_setting) if role_setting else (Role.PRIMARY if broker_id == 0
                                                      else Role.REPLICA)
    if role == Role.PRIMARY:
        if not epochs.entries:
            epochs.begin(1, 0)
        return BrokerRole(epochs, self_address, log_end, Role.PRIMARY, epochs.last_epoch,
                          fence=fence, hooks=hooks)
    return BrokerRole(epochs, self_address, log_end, Role.REPLICA, epochs.last_epoch,
                      primary_address.rstrip("/") or None, fence=fence, hooks=hooks)
