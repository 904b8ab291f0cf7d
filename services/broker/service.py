"""One broker: every part, opened in dependency order and closed in reverse.

The routes reach the parts through ``Broker``; nothing here handles HTTP. Sending touches only
the store (never Redis), so a Redis outage stops consumer-state requests, not producers.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from services.broker.consumers.membership import GroupExpiryLoop, GroupRegistry, ProducerRegistry
from services.broker.consumers.offsets import OffsetStore
from services.broker.consumers.retry import RetryService
from services.broker.consumers.service import ConsumerService
from services.broker.consumers.simple import SimpleConsumerService
from services.broker.delays.routing import Delays, delay_view
from services.broker.delays.scheduler_api import SchedulerClient
from services.broker.delays.service import ScheduleService
from services.broker.internal import InternalService
from services.broker.messaging.dedup import DedupCache
from services.broker.messaging.longpoll import PullHold
from services.broker.messaging.pull import PullService
from services.broker.messaging.query import QueryService
from services.broker.messaging.send import SendService, now_ms
from services.broker.messaging.topics import TopicConfig, TopicManager
from services.broker.observability import BrokerMetrics
from services.broker.registrar import NameserverRegistrar
from services.broker.replication.election import Elector, elector_for
from services.broker.replication.epochs import EpochFile
from services.broker.replication.manager import ReplicationManager
from services.broker.replication.role import BrokerRole, static_role
from services.broker.settings import BrokerSettings
from services.broker.store.store import MessageStore
from services.broker.transactions.checker_api import TxChecking
from services.broker.transactions.service import TransactionService
from services.broker.transactions.table import HalfDedup, TxTable

log = logging.getLogger(__name__)

EPOCH_FILE = "epochs.json"  # the epoch history, in the data directory (replicated groups only)
REGISTER_TIMEOUT_S = 5.0  # a topic create waits this long for the nameservers at most


class Broker:
    """The parts of a running broker. ``start`` opens them; ``stop`` closes them."""

    store: MessageStore
    offsets: OffsetStore
    simple: SimpleConsumerService
    registrar: NameserverRegistrar
    sender: SendService
    pulls: PullService
    queries: QueryService
    retries: RetryService
    consumers: ConsumerService
    internal: InternalService
    transactions: TransactionService
    tx_checking: TxChecking
    schedule: ScheduleService
    role: BrokerRole
    replication: ReplicationManager

    def __init__(self, settings: BrokerSettings, metrics: BrokerMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics if metrics is not None else BrokerMetrics()
        self.topics = TopicManager(settings.data_dir)
        self.hold = PullHold()
        self.groups = GroupRegistry(settings.consumer_expiry_s)
        self.producers = ProducerRegistry(settings.producer_expiry_s)
        self._loops = [GroupExpiryLoop(self.groups, settings.group_expiry_interval_s),
                       GroupExpiryLoop(self.producers, settings.group_expiry_interval_s)]
        self.started = False

    async def start(self) -> None:
        s = self.settings
        s.data_dir.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(self.topics.load)
        self.store = await MessageStore.open(s.store_config())
        store = self.store
        self.role = await asyncio.to_thread(
            static_role, EpochFile(s.data_dir / EPOCH_FILE), s.internal_url,
            lambda: store.log.write_offset,
            # with etcd every member starts as a replica; the election picks the primary
            s.role or ("replica" if s.etcd_urls else ""), s.broker_id, s.primary_address,
            s.replicated)
        self.replication = ReplicationManager(s, store, self.role, self.topics, self.hold.notify)
        # a replicated store wakes long polls only once records are below the high-water mark
        self.store.add_listener(self.replication.visibility.on_write if s.replicated
                                else self.hold.notify)
        self.offsets = OffsetStore(s.redis_url, s.cluster, s.broker_name,
                                   wait_replicas=s.redis_wait_replicas,
                                   wait_timeout_ms=s.redis_wait_timeout_ms)
        await self.offsets.start()
        self.simple = SimpleConsumerService(self.store, s.redis_url, s.cluster, self.hold,
                                            self.offsets)
        dedup = DedupCache(s.dedup_window_s, s.dedup_max_entries, now_ms())
        delays = Delays(s.delay_levels_ms, s.max_delay_ms)
        self.sender = SendService(
            self.store, self.topics, dedup, self.metrics, s.limits(), delays,
            auto_create_queues=s.default_queues if s.auto_create_topics else None)
        self.pulls = PullService(self.store, self.topics, self.hold, self.metrics,
                                 s.long_poll_max_ms)
        self.queries = QueryService(self.store, self.topics)
        self.retries = RetryService(self.store, self.topics, self.metrics,
                                    s.max_reconsume_times, delays,
                                    backoff=s.retry_backoff and bool(s.scheduler_url))
        scheduler = (SchedulerClient(s.scheduler_url, s.token, s.scheduler_timeout_s)
                     if s.scheduler_url else None)
        self.schedule = ScheduleService(self.store, self.topics, self.sender, delays, scheduler,
                                        s.broker_name, self.pulls)
        await self.schedule.start()
        delays.on_first_delay = self.schedule.hold_for_scheduler
        self.queries.views.insert(0, delay_view)  # waiting / cancelled before anything else
        self.consumers = ConsumerService(self.store, self.topics, self.groups, self.offsets,
                                         self.simple, self.pulls, s.long_poll_max_ms)
        self.internal = InternalService(self.store, self.topics, self.sender)
        self.transactions = TransactionService(
            self.store, self.topics, self.sender, self.producers, self.metrics,
            reject=s.reject_transactions, dedup_window_s=s.dedup_window_s,
            dedup_max_entries=s.dedup_max_entries, check_hold_s=s.check_hold_s,
            max_ended=s.max_ended_transactions)
        await self.transactions.start()
        self.tx_checking = TxChecking(self.transactions, s.broker_name, self.pulls)
        self.tx_checking.start_rebuild()
        self.queries.views.append(self.tx_checking.message_view)
        for loop in self._loops:
            loop.start()
        self.registrar = NameserverRegistrar(
            s.nameserver_urls, s.cluster, s.broker_name, s.address, self.topics.route_table,
            s.register_interval_s, token=s.token, broker_id=s.broker_id,
            role=self.role.role.value, epoch=self.role.epoch,
            internal_address=s.internal_address or None,
            grpc_address=s.grpc_address if s.grpc_enabled and s.grpc_port else None,
            max_offset_provider=lambda: store.log.write_offset)
        self.topics.add_listener(self._topic_changed)
        self.role.add_listener(self._role_changed)
        if s.replicated:
            self.replication.on_promoted = self._promoted
            self.replication.register_metrics(self.metrics.registry)
            await self.replication.start()
        self.registrar.start()
        self.elector: Elector | None = elector_for(s, self.role)
        if self.elector is not None:
            self.elector.start()
        self.metrics.add_stats("tidemq_broker_store_", self.store.stats, "store")
        self.metrics.add_stats("tidemq_broker_", self.stats, "broker")
        self.metrics.add_stats("tidemq_broker_transactions_", self.transactions.stats,
                               "transactions")
        self.started = True
        log.info("broker %s of cluster %s serving %s: %d topic(s), data in %s, flush=%s",
                 s.broker_name, s.cluster, s.address, len(self.topics), s.data_dir, s.flush)

    def begin_shutdown(self) -> None:
        """Release held pulls and receives at once (called on SIGTERM, before requests drain)."""
        if self.started:
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
            ("transaction rebuild", self.tx_checking.stop()),
            ("simple consumer", self.simple.close()),
            ("offset store", self.offsets.close()),
            ("scheduler client", self.schedule.close()),
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

    async def _promoted(self) -> None:
        """A replica became primary: derived state learns what the log holds, as after a
        restart (the dedup maps consult the index for a window; the transaction table starts
        empty and loads from the log; pending transactions are found again)."""
        now = now_ms()
        s = self.settings
        self.sender.dedup.mark_incomplete(now)
        tx = self.transactions  # a replica's table may hold loads the log has since moved past
        tx.table = TxTable(self.store, s.max_ended_transactions)
        tx.dedup = HalfDedup(self.store, int(s.dedup_window_s * 1000), s.dedup_max_entries, now)
        await self.tx_checking.stop()
        self.tx_checking.rebuilt.clear()
        self.tx_checking.start_rebuild()

    def _role_changed(self) -> None:
        """Tell the nameservers at once who this broker is now."""
        self.registrar.role = self.role.role.value
        self.registrar.epoch = self.role.epoch
        self.registrar.request_heartbeat()

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
            "dedup_entries": float(len(self.sender.dedup)),
            "held_pulls": float(self.hold.waiter_count()),
            "offset_commit_round_trips": float(self.offsets.round_trips),
            "simple_delivered": float(self.simple.delivered),
            "simple_acked": float(self.simple.acked),
        }
