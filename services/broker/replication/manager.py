"""The replication machinery of one broker, wired together; what a role change does to it.

Started only when the group replicates (``replicas > 1``): without it nothing here runs and the
broker behaves exactly as before. In a replicated group the composition root hands ``gate``
(the write gate around the store's writer) to every service that writes; ``start`` makes reads
stop at the high-water mark and (a replica) starts following its primary. The role's hooks
(``Broker``) call ``stop_following``, ``start_following`` and ``became_primary``.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Awaitable, Callable

import httpx
import orjson
from prometheus_client import CollectorRegistry
from tidemq.protocol import Perm

from tidemq_server.broker.messaging.topics import TopicConfig, TopicManager
from tidemq_server.broker.replication.follower import Follower, FollowerConfig
from tidemq_server.broker.replication.gate import WriteGate
from tidemq_server.broker.replication.metrics import ReplicationCollector
from tidemq_server.broker.replication.quorum import Quorum
from tidemq_server.broker.replication.role import BrokerRole, Role
from tidemq_server.broker.replication.source import FetchSource
from tidemq_server.broker.replication.visibility import Key, Visibility
from tidemq_server.broker.settings import BrokerSettings
from tidemq_server.broker.store.appender import Appender
from tidemq_server.broker.store.config import FlushMode
from tidemq_server.broker.store.store import MessageStore
from tidemq_server.common.auth.client import service_auth
from tidemq_server.common.constants import TOKEN_HEADER
from tidemq_server.common.files import write_atomic
from tidemq_server.common.loop import Periodic
from tidemq_server.common.tls import client_context

log = logging.getLogger(__name__)

METADATA_PATH = "/internal/v1/replication/metadata"
HWM_FILE = "hwm"  # the last high-water mark, in the data directory (text: one integer)


class ReplicationManager:
    """The routes reach the replication parts through it."""

    def __init__(self, settings: BrokerSettings, store: MessageStore, writer: Appender,
                 role: BrokerRole, topics: TopicManager,
                 notify: Callable[[set[Key]], None]) -> None:
        s = settings
        self.settings = s
        self.store = store
        self.role = role
        self.topics = topics
        self.visibility = Visibility(store, notify)
        self.quorum = Quorum(s.quorum, s.replica_lag_max_ms / 1000,
                             durable=s.flush == FlushMode.SYNC, sync=s.replication == "sync",
                             silence_s=s.replica_silence_ms / 1000)
        self.quorum.add_listener(self.visibility.advance)
        self.source = FetchSource(store, role, self.quorum, self.meta_version,
                                  s.replica_fetch_max_bytes, s.replicated)
        self.quorum.add_listener(self.source.wake)  # replicas learn a new HWM at once
        self.gate = WriteGate(writer, role, self.quorum, self._wrote,
                              s.sync_ack_timeout_ms / 1000)
        self.follower = Follower(
            store, role,
            FollowerConfig(s.broker_id, s.internal_url, s.token, s.replica_fetch_wait_ms,
                           s.replica_fetch_max_bytes, s.replica_retry_ms / 1000,
                           durable=s.flush == FlushMode.SYNC,
                           lean_client=s.replica_fetch_client == "lean"),
            on_hwm=self.visibility.advance, on_meta=self._sync_metadata,
            on_truncate=self._truncated)
        headers = {TOKEN_HEADER: s.token} if s.token else {}
        self._client = httpx.AsyncClient(headers=headers, timeout=5.0, verify=client_context(),
                                         auth=service_auth())
        self._meta_version: str | None = None
        self._hwm_path = s.data_dir / HWM_FILE
        self._saved_hwm = 0
        # re-evaluate the in-sync set as time passes; keep the HWM on disk
        self._ticks = Periodic("repl-tick", max(0.01, s.replica_lag_max_ms / 4000), self.tick,
                               pause_first=True)

    # --- lifecycle -------------------------------------------------------------------------
    def register_metrics(self, registry: CollectorRegistry) -> None:
        registry.register(ReplicationCollector(self))

    async def start(self) -> None:
        """Turn replication on (a replicated group only): the store's reads stop at the HWM,
        its listeners hear of records once they are visible."""
        saved = await asyncio.to_thread(self._load_hwm)
        self.visibility.reset(saved)
        self.quorum.restore(saved)
        self._saved_hwm = saved
        self.store.add_listener(self.source.wake)  # right after each write: ship it at once
        self.visibility.activate()
        self.topics.add_listener(self._topics_changed)
        self._ticks.start()
        logging.getLogger("httpx").setLevel(logging.WARNING)  # not one line per fetch
        if self.role.role == Role.REPLICA:
            if self.role.primary_address:
                await self.follower.start(self.role.primary_address)
            else:
                log.warning("replica without a primary address: waiting to be told whom to "
                            "follow (TIDEMQ_BROKER_PRIMARY_ADDRESS or a failover controller)")
        else:
            self.quorum.advance(self.store.log.write_offset)
        log.info("replication on: %s at epoch %d, %d copies, min_insync %d, %s acknowledgement",
                 self.role.role.value, self.role.epoch, self.settings.replicas,
                 self.settings.quorum, self.settings.replication)

    async def close(self) -> None:
        """Stop following and answer waiting sends (safe whether ``start`` ran or not)."""
        self.quorum.fail_waiters()
        await self._ticks.stop()
        await self.follower.close()
        await self._client.aclose()

    async def tick(self) -> None:
        """Re-evaluate the in-sync set as time passes (replicas that went silent); keep the
        HWM on disk, so that a restart serves at once what consumers could already see."""
        if self.role.is_primary:
            self.quorum.advance(self.store.log.write_offset)
        hwm = self.visibility.hwm
        if hwm != self._saved_hwm:
            try:
                await asyncio.to_thread(write_atomic, self._hwm_path, str(hwm))
                self._saved_hwm = hwm
            except OSError:
                log.exception("saving the high-water mark failed; retrying")

    def _load_hwm(self) -> int:
        """The HWM saved by the previous run, never past the log end (0 when none)."""
        try:
            saved = int(self._hwm_path.read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            return 0
        return max(0, min(saved, self.store.log.write_offset))

    def _wrote(self) -> None:
        self.source.wake()
        self.quorum.advance(self.store.log.write_offset)

    # --- role changes (through the role's hooks) --------------------------------------------
    async def stop_following(self) -> None:
        await self.follower.stop()

    async def start_following(self, primary_address: str) -> None:
        self.quorum.fail_waiters()
        await self.follower.stop()
        await self.gate.drained()  # writes already in the writer land before the log is cut
        await self.follower.start(primary_address)

    async def became_primary(self, reload: Callable[[], Awaitable[None]]) -> None:
        """A new term from the HWM; ``reload`` (the state the broker derives from the log,
        loaded again as after a restart) runs before the HWM moves on."""
        self.quorum.reset(self.visibility.hwm)
        await reload()
        self.quorum.advance(self.store.log.write_offset)

    def _truncated(self, offset: int) -> None:
        if offset < self.visibility.hwm:
            log.error("replication: truncated below the high-water mark (%d < %d): records "
                      "consumers may have seen are gone", offset, self.visibility.hwm)
            self.visibility.reset(offset)

    # --- metadata --------------------------------------------------------------------------
    def meta_version(self) -> str:
        if self._meta_version is None:
            table = orjson.dumps(self.topics.route_table(), option=orjson.OPT_SORT_KEYS)
            self._meta_version = f"{zlib.crc32(table):08x}-{len(self.topics)}"
        return self._meta_version

    def _topics_changed(self, cfg: TopicConfig) -> None:
        self._meta_version = None

    def metadata(self) -> dict[str, object]:
        return {"version": self.meta_version(), "topics": [c.to_wire() for c in self.topics.list()]}

    async def _sync_metadata(self, primary: str, version: str) -> None:
        resp = await self._client.get(primary + METADATA_PATH)
        if resp.status_code != 200:
            raise ValueError(f"metadata from {primary}: HTTP {resp.status_code}")
        body = resp.json()
        configs = [TopicConfig(t["name"], int(t["queues"]), Perm(t.get("perm", "rw")))
                   for t in body["topics"]]
        changed = await self.topics.replace(configs)
        if changed:
            log.info("replication: topic table from %s (version %s): %d topic(s)", primary,
                     body["version"], len(configs))

    # --- observability ---------------------------------------------------------------------
    def health(self) -> str | None:
        if self.role.role == Role.REPLICA and self.follower.out_of_range:
            return ("replica out of range: the primary no longer holds this copy's next "
                    f"offset ({self.follower.out_of_range}); rebuild it from an empty data "
                    "directory")
        return None

    def status(self) -> dict[str, object]:
        now = self.quorum.clock()
        end = self.store.log.write_offset
        return {
            **self.role.to_wire(),
            "replicas_configured": self.settings.replicas,
            "min_insync": self.quorum.quorum, "replication": self.settings.replication,
            "hwm": self.visibility.hwm, "log_end": end, "min_offset": self.store.log.min_offset,
            "in_sync_copies": self.quorum.insync_copies() if self.role.is_primary else None,
            "replicas": [r.to_wire(end, now, self.quorum.in_sync(r, now))
                         for r in sorted(self.quorum.replicas.values(),
                                         key=lambda r: r.broker_id)],
            "following": self.follower.primary if self.follower.running else None,
            "follower_lag_bytes": self.follower.lag_bytes(),
            "out_of_range": self.follower.out_of_range,
            "last_error": self.follower.last_error,
        }
