"""Topic configuration of one broker: name → queue count and permission, kept in topics.json.

Reads are plain dict lookups (the send and pull hot paths call ``get``). Writes are rare: each
rewrites the whole file atomically (temp file, fsync, rename, fsync of the directory), so a crash
leaves either the old or the new table, never a torn one.

The public API creates and deletes only ordinary topics (``put``, ``delete``); system topics
(retry, DLQ, the internal ``SystemTopic`` ones) are created by the broker itself through
``ensure_system``.

Deleting a topic removes it from the table only: its messages stay in the commit log (and its
consume queues on disk) until retention removes them, unreadable while the topic is unknown.
Re-creating a topic of the same name continues its queues, so messages still retained and the
groups' committed offsets apply again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import orjson
from tidemq.protocol import (
    ErrorCode,
    Perm,
    ProtocolError,
    SystemTopic,
    is_system_topic,
    validate_topic_name,
)

from tidemq_server.common.files import write_atomic

log = logging.getLogger(__name__)

MAX_QUEUES = 1024  # queues per topic
FILE_NAME = "topics.json"
FORMAT_VERSION = 1


#: Queue counts of the internal system topics (``SCHEDULE_TOPIC_XXXX``: one queue per level).
SYSTEM_TOPIC_QUEUES: dict[str, int] = {
    SystemTopic.TRANS_HALF.value: 1,
    SystemTopic.TRANS_OP_HALF.value: 1,
    SystemTopic.TRANS_CHECK_MAX.value: 1,
    SystemTopic.TRANS_EVENTS.value: 1,
    SystemTopic.SCHEDULE.value: 18,
    SystemTopic.TIMER_INTAKE.value: 1,
    SystemTopic.TIMER_CANCELS.value: 1,
}


@dataclass(frozen=True, slots=True)
class TopicConfig:
    name: str
    queues: int
    perm: Perm = Perm.READ_WRITE

    @property
    def system(self) -> bool:
        return is_system_topic(self.name)

    def to_wire(self) -> dict[str, object]:
        return {"name": self.name, "queues": self.queues, "perm": self.perm.value}


def validate_queues(queues: int) -> int:
    if isinstance(queues, bool) or not isinstance(queues, int) or not 1 <= queues <= MAX_QUEUES:
        raise ProtocolError(ErrorCode.BAD_REQUEST,
                            f"queues must be an integer 1-{MAX_QUEUES}, got {queues!r}")
    return queues


def validate_shrink(current: TopicConfig | None, queues: int,
                 offsets: Callable[[str, int], tuple[int, int]]) -> None:
    """409 QUEUES_NOT_EMPTY when ``queues`` would drop queues of ``current`` that still hold
    messages (``offsets``: topic, queue id → (min, max)): routes stop naming the dropped queues,
    so no consumer would ever read them. Once retention has deleted their messages (or the
    topic is deleted and created again) the topic can shrink."""
    if current is None or queues >= current.queues:
        return
    held = {q: hi - lo for q in range(queues, current.queues)
            for lo, hi in [offsets(current.name, q)] if hi > lo}
    if held:
        raise ProtocolError(
            ErrorCode.QUEUES_NOT_EMPTY,
            f"topic {current.name!r} cannot shrink from {current.queues} to {queues} queues: "
            f"queue(s) {', '.join(map(str, sorted(held)))} still hold {sum(held.values())} "
            "message(s) no consumer would read any more. Keep the queue count until retention "
            "deletes them, or move the topic's traffic to a new topic")


class WriteGuard(Protocol):
    def require_writable(self) -> None:
        """Raise ProtocolError when this broker may not change its topics (a replica:
        NOT_PRIMARY); replication's ``BrokerRole`` is the broker's."""


class TopicManager:
    """The topic table, persisted to ``{data_dir}/topics.json``."""

    def __init__(self, data_dir: Path, guard: WriteGuard | None = None) -> None:
        self.path = data_dir / FILE_NAME
        self._topics: dict[str, TopicConfig] = {}
        self._lock = asyncio.Lock()
        self._listeners: list[Callable[[TopicConfig], None]] = []
        self.guard = guard  # asked before a client's create, update or delete (None: never)

    def add_listener(self, callback: Callable[[TopicConfig], None]) -> None:
        """Called after every create, update or delete (e.g. to heartbeat the nameservers)."""
        self._listeners.append(callback)

    def load(self) -> None:
        """Read the table from disk (an absent file is an empty table). Called once at start."""
        if not self.path.exists():
            log.info("no %s yet: starting with no topics", self.path)
            return
        data = orjson.loads(self.path.read_bytes())
        topics = {}
        for item in data.get("topics", []):
            cfg = TopicConfig(item["name"], int(item["queues"]), Perm(item.get("perm", "rw")))
            topics[cfg.name] = cfg
        self._topics = topics
        log.info("loaded %d topic(s) from %s", len(topics), self.path)

    # --- reads (hot path) ------------------------------------------------------------------------

    def get(self, name: str) -> TopicConfig | None:
        return self._topics.get(name)

    def require(self, name: str) -> TopicConfig:
        """The topic, or 404 TOPIC_NOT_FOUND (400 INVALID_TOPIC_NAME for an impossible name)."""
        cfg = self._topics.get(name)
        if cfg is None:
            raise self.not_found(name)
        return cfg

    @staticmethod
    def not_found(name: str) -> ProtocolError:
        """TOPIC_NOT_FOUND for a valid name (raises INVALID_TOPIC_NAME for an invalid one)."""
        validate_topic_name(name)
        return ProtocolError(ErrorCode.TOPIC_NOT_FOUND,
                             f"topic {name!r} does not exist on this broker: create it with "
                             f"PUT /v1/topics/{name}")

    def list(self) -> list[TopicConfig]:
        return sorted(self._topics.values(), key=lambda c: c.name)

    def route_table(self) -> dict[str, dict[str, object]]:
        """``{name: {queues, perm}}`` for nameserver heartbeats (system topics included)."""
        return {c.name: {"queues": c.queues, "perm": c.perm.value} for c in self._topics.values()}

    def __len__(self) -> int:
        return len(self._topics)

    # --- writes ----------------------------------------------------------------------------------

    @staticmethod
    def validate_creatable(name: str) -> None:
        """400 INVALID_TOPIC_NAME or 403 FORBIDDEN_SYSTEM_TOPIC unless the API may create it."""
        validate_topic_name(name)
        if is_system_topic(name):
            raise ProtocolError(ErrorCode.FORBIDDEN_SYSTEM_TOPIC,
                                f"{name!r} is a system topic: it cannot be created or changed "
                                "through the public API")

    async def put(self, name: str, queues: int, perm: Perm) -> tuple[TopicConfig, bool]:
        """Create or update an ordinary topic; returns (config, changed)."""
        self.validate_creatable(name)
        if self.guard is not None:
            self.guard.require_writable()
        return await self._set(TopicConfig(name, validate_queues(queues), perm))

    async def ensure_system(self, name: str, queues: int | None = None) -> tuple[TopicConfig, bool]:
        """Create an internal topic if absent (retry and DLQ topics get one queue)."""
        cfg = self._topics.get(name)
        if cfg is not None:
            return cfg, False
        validate_topic_name(name)
        count = queues or SYSTEM_TOPIC_QUEUES.get(name, 1)
        return await self._set(TopicConfig(name, validate_queues(count), Perm.READ_WRITE))

    async def delete(self, name: str) -> TopicConfig:
        """Remove an ordinary topic from the table; returns its last config.

        403 FORBIDDEN_SYSTEM_TOPIC for a system topic, 404 TOPIC_NOT_FOUND for an unknown one.
        """
        self.validate_creatable(name)
        if self.guard is not None:
            self.guard.require_writable()
        async with self._lock:
            cfg = self._topics.get(name)
            if cfg is None:
                raise self.not_found(name)
            new = {k: v for k, v in self._topics.items() if k != name}
            await asyncio.to_thread(self._write, new)
            self._topics = new
        log.info("topic %s deleted (%d queue(s)); its messages stay until retention removes "
                 "them", name, cfg.queues)
        self._notify(cfg)
        return cfg

    async def _set(self, cfg: TopicConfig) -> tuple[TopicConfig, bool]:
        async with self._lock:
            if self._topics.get(cfg.name) == cfg:
                return cfg, False
            new = {**self._topics, cfg.name: cfg}
            await asyncio.to_thread(self._write, new)
            previous = self._topics.get(cfg.name)
            self._topics = new
        if previous is None:
            log.info("topic %s created: %d queue(s), perm %s", cfg.name, cfg.queues, cfg.perm)
        else:
            log.info("topic %s updated: %d → %d queue(s), perm %s → %s", cfg.name,
                     previous.queues, cfg.queues, previous.perm, cfg.perm)
        self._notify(cfg)
        return cfg, True

    async def replace(self, configs: Sequence[TopicConfig]) -> bool:
        """Make the table exactly ``configs`` (a replica takes its primary's); True when it
        changed. Listeners hear of every topic added, changed or removed."""
        new = {c.name: c for c in configs}
        async with self._lock:
            old = self._topics
            if new == old:
                return False
            await asyncio.to_thread(self._write, new)
            self._topics = new
        for cfg in [*(c for n, c in new.items() if old.get(n) != c),
                    *(c for n, c in old.items() if n not in new)]:
            self._notify(cfg)
        return True

    def _notify(self, cfg: TopicConfig) -> None:
        for callback in self._listeners:
            try:
                callback(cfg)
            except Exception:
                log.exception("topic listener failed for %s", cfg.name)

    def _write(self, topics: dict[str, TopicConfig]) -> None:
        data = orjson.dumps(
            {"version": FORMAT_VERSION,
             "topics": [c.to_wire() for c in sorted(topics.values(), key=lambda c: c.name)]},
            option=orjson.OPT_INDENT_2,
        )
        write_atomic(self.path, data)
