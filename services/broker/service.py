"""One broker: its composition root. ``Broker.start`` builds every part once, in dependency
order, handing each its collaborators through its constructor; nothing is rewired afterwards
(tests/broker/test_service.py keeps it so). ``stop`` closes the parts in reverse.

The write pipeline (store/appender.py) is chosen here, once: the store's group-commit writer,
wrapped by the replication gate when the group replicates, is the ``Appender`` of the one
``Ingest`` (ingest/writes.py) every service that stores records holds: the broker's one write
path. A role change reaches replication and the state derived from the log
through this class (``RoleHooks``, given to the role at construction).

The routes reach the parts through ``Broker``; nothing here handles HTTP. Sending touches only
the store (never Redis), so a Redis outage stops consumer-state requests, not producers.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tidemq_server.broker.consumers.membership import (
    GroupExpiryLoop,
    GroupRegistry,
    ProducerRegistry,
)
from tidemq_server.broker.consumers.offsets import OffsetStore
from tidemq_server.broker.consumers.retry import RetryService
from tidemq_server.broker.consumers.service import ConsumerService
from tidemq_server.broker.consumers.simple import SimpleConsumerService
from tidemq_server.broker.delays.routing import DelayRouter
from tidemq_server.broker.delays.scheduler_client import SchedulerClient
from tidemq_server.broker.delays.service import DelayLookup, DelayService
from tidemq_server.broker.ingest.dedup import DedupCache
from tidemq_server.broker.ingest.writes import Ingest
from tidemq_server.broker.internal import InternalService
from tidemq_server.broker.messaging.longpoll import PullHold
from tidemq_server.broker.messaging.pull import PullService
from tidemq_server.broker.messaging.query import QueryService
from tidemq_server.broker.messaging.send import SendService
from tidemq_server.broker.messaging.topics import TopicConfig, TopicManager
from tidemq_server.broker.observability import (
    BROKER_STATS,
    STORE_STATS,
    TRANSACTION_STATS,
    BrokerMetrics,
)
from tidemq_server.broker.registrar import NameserverRegistrar
from tidemq_server.broker.replication.election import Elector, LeaseFence, elected, elector_for
from tidemq_server.broker.replication.epochs import EpochFile
from tidemq_server.broker.replication.manager import ReplicationManager
from tidemq_server.broker.replication.recopy import recopy_damaged
from tidemq_server.broker.replication.role import BrokerRole, always, static_role
from tidemq_server.broker.settings import BrokerSettings
from tidemq_server.broker.states import delay_view
from tidemq_server.broker.store.appender import Appender
from tidemq_server.broker.store.store import MessageStore
from tidemq_server.broker.transactions.checker_requests import CheckerRequests
from tidemq_server.broker.transactions.service import TransactionService
from tidemq_server.common.clock import now_ms

log = logging.getLogger(__name__)

EPOCH_FILE = "epochs.json"  # the epoch history, in the data directory (replicated groups only)
REGISTER_TIMEOUT_S = 5.0  # a topic create waits this long for the nameservers at most


class Broker:
    """The parts of a running broker. ``start`` builds and opens them; ``stop`` closes them."""

    store: MessageStore
    role: BrokerRole
    topics: TopicManager
    replication: ReplicationManager
    appender: Appender
    ingest: Ingest
    offsets: OffsetStore
    simple: SimpleConsumerService
    sender: SendService
    pulls: PullService
    retries: RetryService
    delays: DelayService
    consumers: ConsumerService
    internal: InternalService
    transactions: TransactionService
    checker_requests: CheckerRequests
    queries: QueryService
    registrar: NameserverRegistrar
    elector: Elector | None

    def __init__(self, settings: BrokerSettings, metrics: BrokerMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics if metrics is not None else BrokerMetrics()
        self.hold = PullHold()
        self.groups = GroupRegistry(settings.consumer_expiry_s)
        self.producers = ProducerRegistry(settings.producer_expiry_s)
        self._loops = [GroupExpiryLoop(self.groups, settings.group_expiry_interval_s),
                       GroupExpiryLoop(self.producers, settings.group_expiry_interval_s)]
        self.started = False

    async def start(self) -> None:
        s = self.settings
        s.data_dir.mkdir(parents=True, exist_ok=True)
        # --- the store, and who this broker is in its group ---------------------------------
        self.store = store = await MessageStore.open(s.store_config())
        lease = LeaseFence() if elected(s) else None  # etcd decides: the elector moves it
        self.role = role = await asyncio.to_thread(
            static_role, EpochFile(s.data_dir / EPOCH_FILE), s.internal_url,
            lambda: store.log.write_offset,
            # with etcd every member starts as a replica; the election picks the primary
            s.role or ("replica" if s.etcd_urls else ""), s.broker_id, s.primary_address,
            s.replicated, fence=lease if lease is not None else always,
            hooks=self if s.replicated else None)
        if store.log.damaged_at and s.replicated and (s.etcd_urls or s.role == "replica"):
            await recopy_damaged(store, role)
        self.topics = topics = TopicManager(s.data_dir, guard=role if s.replicated else None)
        await asyncio.to_thread(topics.load)
        # --- the write pipeline: the group-commit writer, behind the gate when replicated ---
        self.replication = ReplicationManager(s, store, store.writer, role, topics,
                                              self.hold.notify)
        self.appender = self.replication.gate if s.replicated else store.writer
        # a replicated store wakes long polls only once records are below the high-water mark
        store.add_listener(self.replication.visibility.on_write if s.replicated
                           else self.hold.notify)
        # --- consumer state (Redis) ----------------------------------------------------------
        self.offsets = OffsetStore(s.redis_url, s.cluster, s.broker_name,
                                   wait_replicas=s.redis_wait_replicas,
                                   wait_timeout_ms=s.redis_wait_timeout_ms)
        await self.offsets.start()
        self.simple = SimpleConsumerService(store, s.redis_url, s.cluster, self.hold,
                                            self.offsets)
        # --- the one write path, and the services that store records through it ------------
        lookup = DelayLookup(store)
        router = DelayRouter(s.delay_levels_ms, s.max_delay_ms,
                             on_first_delay=lookup.hold_for_scheduler, lookup=lookup.standing)
        dedup = DedupCache(s.dedup_window_s, s.dedup_max_entries, now_ms())
        if dedup.enabled:  # the first window's checks of the previous run's ids skip the disk
            store.track_recent_keys(now_ms() - dedup.window_ms)
        self.ingest = ingest = Ingest(store, self.appender, dedup, self.metrics, router.waiting)
        self.sender = SendService(
            ingest, topics, s.limits(), router,
            auto_create_queues=s.default_queues if s.auto_create_topics else None)
        self.pulls = PullService(store, topics, self.hold, self.metrics, s.long_poll_max_ms)
        self.retries = RetryService(store, ingest, topics, self.metrics,
                                    s.max_reconsume_times, router,
                                    backoff=s.retry_backoff and bool(s.scheduler_url))
        scheduler = (SchedulerClient(s.scheduler_url, s.token, s.scheduler_timeout_s)
                     if s.scheduler_url else None)
        self.delays = DelayService(store, ingest, topics, router, scheduler, s.broker_name,
                                   self.pulls)
        await self.delays.start()
        self.consumers = ConsumerService(store, topics, self.groups, self.offsets,
                                         self.simple, self.pulls, s.long_poll_max_ms)
        self.internal = InternalService(store, topics, ingest)
        self.transactions = TransactionService(
            store, ingest, topics, self.sender, self.producers, self.metrics,
            reject=s.reject_transactions, dedup_window_s=s.dedup_window_s,
            dedup_max_entries=s.dedup_max_entries, check_hold_s=s.check_hold_s,
            max_ended=s.max_ended_transactions)
        await self.transactions.start()
        self.checker_requests = CheckerRequests(self.transactions, ingest, s.broker_name,
                                                self.pulls, guard=role if s.replicated else None)
        self.checker_requests.start_rebuild()
        # waiting / cancelled delays first, then transactions, then a plain message's state
        self.queries = QueryService(store, topics,
                                    views=(delay_view, self.checker_requests.message_view))
        for loop in self._loops:
            loop.start()
        # --- the cluster: nameservers, replication, election --------------------------------
        self.registrar = NameserverRegistrar(
            s.nameserver_urls, s.cluster, s.broker_name, s.address, topics.route_table,
            s.register_interval_s, token=s.token, broker_id=s.broker_id, standing=role,
            internal_address=s.internal_address or None,
            grpc_address=s.grpc_address if s.grpc_enabled and s.grpc_port else None,
            max_offset_provider=lambda: store.log.write_offset)
        topics.add_listener(self._topic_changed)
        role.add_listener(self._role_changed)
        if s.replicated:
            self.replication.register_metrics(self.metrics.registry)
            await self.replication.start()
        self.registrar.start()
        self.elector = (elector_for(s, role, lease, self.replication.quorum)
                        if lease is not None else None)
        if self.elector is not None:
            self.elector.start()
        self.metrics.add_stats("tidemq_broker_store_", store.stats, STORE_STATS, "store")
        self.metrics.add_stats("tidemq_broker_", self.stats, BROKER_STATS, "broker")
        self.metrics.add_stats("tidemq_broker_transactions_", self.transactions.stats,
                               TRANSACTION_STATS, "transactions")
        self.started = True
        log.info("broker %s of cluster %s serving %s: %d topic(s), data in %s, flush=%s",
                 s.broker_name, s.cluster, s.address, len(topics), s.data_dir, s.flush)

    def begin_shutdown(self) -> None:
        """Release held pulls and receives at once and hand the group's lead over (called on
        SIGTERM, before requests drain: a successor is elected while this broker drains)."""
        if self.started:
            if self.elector is not None:
                self.elector.resign()
            self.pulls.close()
            self.transactions.close()
        else:
            self.hold.wake_all()

    async def stop(self) -> None:
        if not self.started:
            return
        self.started = False
        self.begin_shutdown()
        steps: list[tuple[str, Any]] = [
            *((("election", self.elector.close()),) if self.elector is not None else ()),
            ("replication", self.replication.close()),
            ("nameserver registrar", self.registrar.stop()),
            *((f"loop {loop.name}", loop.stop()) for loop in self._loops),
            ("transaction rebuild", self.checker_requests.stop()),
            ("simple consumer", self.simple.close()),
            ("offset store", self.offsets.close()),
            ("scheduler client", self.delays.close()),
            ("message store", self.store.close()),
        ]
        for name, step in steps:
            try:
                await step
            except Exception:
                log.exception("closing the %s failed", name)
        log.info("broker %s stopped", self.settings.broker_name)

    async def announce(self) -> None:
        """Register the current topics with every nameserver now (bounded wait)."""
        try:
            await asyncio.wait_for(self.registrar.register_now(), REGISTER_TIMEOUT_S)
        except TimeoutError:
            log.warning("nameserver registration took longer than %.0f s; the periodic "
                        "heartbeat will retry", REGISTER_TIMEOUT_S)

    def _topic_changed(self, cfg: TopicConfig) -> None:
        self.registrar.request_heartbeat()

    def _role_changed(self) -> None:
        """Tell the nameservers at once who this broker is now (the registrar reads it from
        the role)."""
        self.registrar.request_heartbeat()

    # --- RoleHooks: what a role change does (the role calls these) --------------------------
    async def stop_following(self) -> None:
        await self.replication.stop_following()

    async def start_following(self, primary_address: str) -> None:
        await self.replication.start_following(primary_address)

    async def became_primary(self) -> None:
        await self.replication.became_primary(self._reload)

    async def _reload(self) -> None:
        """A replica became primary: derived state learns what the log holds, as after a
        restart (the dedup maps consult the index for a window; the transaction table starts
        empty and loads from the log; pending transactions are found again)."""
        now = now_ms()
        self.ingest.dedup.mark_incomplete(now)
        self.transactions.reload(now)
        await self.checker_requests.rebuild_again()

    def health(self) -> str | None:
        """Why this broker cannot take writes until it is restarted (its /healthz fails), or
        None. Refusals that pass by themselves (busy, disk full) are not failures."""
        if not self.started:
            return None
        failure = self.store.failure
        if not failure:
            return self.replication.health() if self.settings.replicated else None
        return f"store writer stopped, every write is refused until a restart: {failure}"

    def stats(self) -> dict[str, float]:
        return {
            "topics": float(len(self.topics)),
            "dedup_entries": float(len(self.ingest.dedup)),
            "held_pulls": float(self.hold.waiter_count()),
            "held_pulls_woken": float(self.hold.notified),
            "offset_commit_round_trips": float(self.offsets.round_trips),
            "simple_delivered": float(self.simple.delivered),
            "simple_acked": float(self.simple.acked),
        }
