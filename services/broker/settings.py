"""Broker settings, read from ``TIDEMQ_BROKER_*`` environment variables.

One field per knob, with its unit and default in the comment. The store's own knobs are passed
through to ``StoreConfig`` by ``store_config()``; message limits to ``Limits`` by ``limits()``.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict
from tidemq.protocol import Limits

from tidemq_server.broker.store.config import FlushMode, StoreConfig
from tidemq_server.broker.store.types import GiB, MiB
from tidemq_server.common.constants import (
    BROKER_GRPC_PORT,
    BROKER_HEARTBEAT_INTERVAL_S,
    BROKER_PORT,
    CONSUMER_EXPIRY_S,
    LONG_POLL_MAX_MS,
    MAX_BROKER_ID,
    PRODUCER_EXPIRY_S,
    REDIS_WAIT_REPLICAS,
    REDIS_WAIT_TIMEOUT_MS,
    WILDCARD_HOSTS,
)
from tidemq_server.common.delaylevels import DEFAULT_DELAY_LEVELS, parse_delay_levels
from tidemq_server.common.discovery import split_urls
from tidemq_server.common.settings import LogLevel, RedisUrl, ServiceSettings

DAY_MS = 24 * 3600 * 1000
LeanDoorMode = Literal["protocol", "asgi", "off"]
_LIMITS = Limits()


class BrokerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="TIDEMQ_BROKER_", extra="ignore")

    # --- identity and neighbours ---------------------------------------------------------------
    port: int = BROKER_PORT  # listen port
    broker_name: str = Field(default="broker-a", min_length=1)  # name in nameserver routes
    broker_id: int = Field(default=0, ge=0, le=MAX_BROKER_ID)  # member of its group (0 = primary)
    # advertised_address (TIDEMQ_BROKER_ADVERTISED_ADDRESS, services/common/settings.py): the
    # base URL in routes, replication and the etcd claim; required when host is 0.0.0.0 or ::
    # base URL the deployment's own services (checker, scheduler, metrics sidecar, console, the
    # group's other members) use when it is not the advertised one, e.g. compose's
    # https://broker-a:10911 while clients on the host get https://127.0.0.1:10911 ("" = address)
    internal_address: str = ""
    nameservers: str = ""  # comma-separated nameserver base URLs ("" = register nowhere)
    # nameserver heartbeat period (s)
    register_interval_s: float = Field(default=BROKER_HEARTBEAT_INTERVAL_S, gt=0)
    redis_url: RedisUrl = "redis://127.0.0.1:6379/0"  # consumer offsets, simple-consumer state
    # an offset commit is answered once this many Redis replicas have it (WAIT); -1 = 1 when the
    # master has a replica connected, else 0; 0 = never wait
    redis_wait_replicas: int = Field(default=REDIS_WAIT_REPLICAS, ge=-1, le=16)
    # longest wait for those replicas; past it the commit is answered 503 UNAVAILABLE (ms)
    redis_wait_timeout_ms: int = Field(default=REDIS_WAIT_TIMEOUT_MS, gt=0, le=60_000)

    # --- failover: etcd decides which member leads (services/broker/replication/election.py) --
    # comma-separated etcd client URLs ("" = no automatic failover: roles stay as configured)
    etcd_endpoints: str = ""
    # the primary's etcd lease TTL (s, whole seconds; etcd's own floor is 2 with its default
    # election timeout): a dead primary is replaced after about this; why 2: docs/operations.md
    lease_s: float = Field(default=2.0, ge=1)
    # the primary stops acknowledging writes this long before its lease could lapse in etcd (s)
    lease_margin_s: float = Field(default=0.5, ge=0)
    election_interval_s: float = Field(default=0.5, gt=0)  # lease renewal / election step (s)
    # CheckQuorum (replication/aside.py): a primary whose replicas have all stopped fetching
    # (their next fetch overdue by replica_silence_ms) this long while etcd shows them alive
    # gives up the lead (s). Why 0.5: two election steps, so one late step never moves the
    # lead, on top of a silence that already spans several fetches; short beside the lease,
    # so a cut primary is left about as fast as a dead one is replaced
    step_aside_after_s: float = Field(default=0.5, gt=0)
    # a primary that stepped aside does not run again for this many lease lengths (or until it
    # follows the new primary). Why 3: long enough for the replicas to settle and elect one of
    # them (a lease at most when a watch event is missed), short enough that a group whose
    # replicas cannot be elected is without a primary for a few leases only
    step_aside_hold_leases: float = Field(default=3.0, gt=0)

    # --- store (see services/broker/store/config.py) -----------------------------------------
    data_dir: Path = Path("tidemq-data/broker")  # store files and topics.json live here
    flush: FlushMode = FlushMode.ASYNC  # "async": ack once written; "sync": ack after fsync
    flush_interval_ms: int = Field(default=500, gt=0)  # async flush period (ms)
    segment_bytes: int = Field(default=1 * GiB, gt=0)  # commit log segment size (bytes)
    # refuse sends (BROKER_BUSY) once the write queue's head waited this long (ms)
    max_send_wait_ms: int = Field(default=200, gt=0)
    max_pending_bytes: int = Field(default=256 * MiB, gt=0)  # BROKER_BUSY past this backlog (B)
    # delete commit log segments older than this (hours)
    file_reserved_hours: float = Field(default=72.0, gt=0)
    retention_interval_s: float = Field(default=10.0, gt=0)  # how often retention runs (s)
    # past this disk usage ratio, delete the oldest segments early
    disk_high_water_ratio: float = Field(default=0.85, gt=0, le=1)
    # past this disk usage ratio with nothing deletable, refuse sends (DISK_FULL)
    disk_full_ratio: float = Field(default=0.95, gt=0, le=1)
    # a write that would leave less free space than this is refused (DISK_FULL) before any of
    # it is written; writes resume by themselves once space returns (bytes)
    disk_min_free_bytes: int = Field(default=16 * MiB, ge=0)

    # --- topics --------------------------------------------------------------------------------
    # queues of a topic created without a count (PUT without queues, auto-creation)
    default_queues: int = Field(default=8, ge=1, le=1024)
    auto_create_topics: bool = False  # a send to an unknown topic creates it (opt-in)

    # --- messages ------------------------------------------------------------------------------
    dedup_window_s: float = Field(default=600.0, ge=0)  # same (topic, message_id) answered once (s)
    dedup_max_entries: int = Field(default=500_000, ge=0)  # in-memory dedup map size; older: index
    max_body_bytes: int = Field(default=_LIMITS.max_body_bytes, gt=0)  # one message body (bytes)
    # encoded user properties of one message (bytes)
    max_properties_bytes: int = Field(default=_LIMITS.max_properties_bytes, gt=0)
    max_batch_messages: int = Field(default=_LIMITS.max_batch_messages, gt=0)  # messages per send
    max_batch_bytes: int = Field(default=_LIMITS.max_batch_bytes, gt=0)  # bytes per send request
    max_delay_ms: int = Field(default=30 * DAY_MS, gt=0, le=366 * DAY_MS)  # longest delay (ms)
    # delay level table, level 1 first (services/common/delaylevels.py); shared with the scheduler
    delay_levels: str = DEFAULT_DELAY_LEVELS
    scheduler_url: str = ""  # scheduler base URL: cancel and /v1/scheduled ask it ("" = none)
    scheduler_timeout_s: float = Field(default=10.0, gt=0)  # one request to the scheduler (s)
    # consumer retries back off by delay level 3 + reconsume count (needs a scheduler: without
    # scheduler_url a retry goes straight to %RETRY%group)
    retry_backoff: bool = True
    reject_transactions: bool = False  # answer TRANSACTIONS_DISABLED to transactional sends
    # a transaction check waits this long for a producer of its group to poll it (s)
    check_hold_s: float = Field(default=30.0, gt=0)
    # ended transactions remembered in memory (older ones are read back from the store)
    max_ended_transactions: int = Field(default=50_000, ge=0)

    # --- consumers -----------------------------------------------------------------------------
    max_reconsume_times: int = Field(default=16, ge=0)  # retries before a message goes to the DLQ
    # longest held pull or receive (ms); longer wait_ms are cut to this
    long_poll_max_ms: int = Field(default=LONG_POLL_MAX_MS, ge=0, le=LONG_POLL_MAX_MS)
    # drop a consumer group member silent this long (s)
    consumer_expiry_s: float = Field(default=CONSUMER_EXPIRY_S, gt=0)
    producer_expiry_s: float = Field(default=PRODUCER_EXPIRY_S, gt=0)  # drop a silent producer (s)
    # how often silent members are swept (s)
    group_expiry_interval_s: float = Field(default=5.0, gt=0)

    # --- the REST door ---------------------------------------------------------------------------
    # how the hot routes (send, pulls, transaction halves and ends, acks, heartbeats) are served
    # (issue 33, bench/door.py): "protocol" = by the HTTP/1.1 protocol itself, without the
    # FastAPI app; "asgi" = by a middleware inside the app; "off" = through the whole app
    lean_door: LeanDoorMode = "protocol"

    # --- gRPC front door: RocketMQ 5 clients (apache.rocketmq.v2.MessagingService) ------------
    grpc_enabled: bool = True  # serve gRPC beside REST (also off when grpc_port is 0)
    # gRPC listen port (0 = off); a busy default port only logs, a busy configured one fails
    grpc_port: int = Field(default=BROKER_GRPC_PORT, ge=0, le=65535)
    grpc_advertised_address: str = ""  # host:port in gRPC routes ("" = {host}:{grpc_port})
    grpc_long_polling_ms: int = Field(default=20_000, gt=0)  # push consumers' long poll (ms)
    # invisibility of a message received without one (push consumers) (ms)
    grpc_invisible_ms: int = Field(default=60_000, gt=0)

    # --- replication inside the group (services/broker/replication) ---------------------------
    # copies of this group's log, the primary included (1 = no replication, nothing changes)
    replicas: int = Field(default=1, ge=1, le=MAX_BROKER_ID + 1)
    # static role until a failover controller drives it ("" = primary when broker_id is 0);
    # read from TIDEMQ_BROKER_ROLE
    role: Literal["", "primary", "replica"] = ""
    primary_address: str = ""  # a replica's primary (base URL) while no controller tells it
    # "sync": a send is acknowledged once min_insync copies hold it; "async": at once
    replication: Literal["sync", "async"] = "sync"
    # copies (the primary included) that must hold a record before a sync send is acknowledged
    # and before consumers see it; fewer live in-sync copies → NOT_ENOUGH_REPLICAS (0 = majority)
    min_insync: int = Field(default=0, ge=0, le=MAX_BROKER_ID + 1)
    # a replica is in sync while it caught up with the primary's end within this time (ms)
    replica_lag_max_ms: int = Field(default=5000, gt=0)
    # a replica's fetch at the primary's end is held this long for new records (ms)
    replica_fetch_wait_ms: int = Field(default=500, ge=0, le=LONG_POLL_MAX_MS)
    # a replica whose next fetch has not arrived this long after its last one's wait ran out
    # is not heard: the primary counts it cut off for CheckQuorum (a fetch is sent again as
    # soon as the last is answered; why 500: ample for a round trip and a 4 MiB chunk) (ms)
    replica_silence_ms: int = Field(default=500, gt=0)
    replica_fetch_max_bytes: int = Field(default=4 * MiB, ge=64 * 1024)  # one fetch answer (B)
    replica_retry_ms: int = Field(default=200, gt=0)  # a failed fetch is retried after (ms)
    # a replica's fetch client: "lean" (replication/fetchclient.py: asyncio streams, less CPU
    # per fetch) or "httpx"
    replica_fetch_client: Literal["lean", "httpx"] = "lean"
    # a sync send waits this long for min_insync copies before NOT_ENOUGH_REPLICAS (ms)
    sync_ack_timeout_ms: int = Field(default=5000, gt=0)

    log_level: LogLevel = "info"

    @field_validator("internal_address")
    @classmethod
    def _strip_slash(cls, value: str) -> str:
        return value.strip().rstrip("/")

    @model_validator(mode="after")
    def _check_wildcard(self) -> BrokerSettings:
        if self.host in WILDCARD_HOSTS and not self.advertised_address:
            raise ValueError(
                f"host {self.host!r} binds every interface but names none: set "
                "TIDEMQ_BROKER_ADVERTISED_ADDRESS to the base URL other hosts reach this broker "
                "at (e.g. http://10.0.0.5:10911); routes, replicas and the etcd claim use it")
        return self

    @property
    def address(self) -> str:
        """The base URL registered with nameservers, replicas and etcd."""
        return self.public_url

    @property
    def internal_url(self) -> str:
        """The base URL the other services of the deployment reach this broker at."""
        return self.internal_address or self.address

    @property
    def grpc_address(self) -> str:
        """``host:port`` of the gRPC front door that routes give to RocketMQ clients."""
        if self.grpc_advertised_address:
            return self.grpc_advertised_address
        return f"{self.reachable_host}:{self.grpc_port}"

    @property
    def reachable_host(self) -> str:
        """The host others reach this broker at (the advertised one, else the bind host)."""
        host = self.public_host
        return f"[{host}]" if ":" in host else host

    @property
    def nameserver_urls(self) -> list[str]:
        return split_urls(self.nameservers)

    def limits(self) -> Limits:
        return Limits(
            max_body_bytes=self.max_body_bytes,
            max_properties_bytes=self.max_properties_bytes,
            max_batch_messages=self.max_batch_messages,
            max_batch_bytes=self.max_batch_bytes,
            max_delay_ms=self.max_delay_ms,
            max_delay_level=len(self.delay_levels_ms),
        )

    @model_validator(mode="after")
    def _validate_lease(self) -> BrokerSettings:
        if self.lease_margin_s + self.election_interval_s >= self.lease_s:
            raise ValueError(f"lease_margin_s ({self.lease_margin_s}) + election_interval_s "
                             f"({self.election_interval_s}) must be shorter than lease_s "
                             f"({self.lease_s}): the primary must renew before its fence shuts")
        return self

    @property
    def etcd_urls(self) -> list[str]:
        return split_urls(self.etcd_endpoints)

    @property
    def replicated(self) -> bool:
        """Whether this group replicates (more than one copy)."""
        return self.replicas > 1

    @property
    def quorum(self) -> int:
        """Copies that must hold a record before it is acknowledged (sync) and visible."""
        if self.min_insync:
            return min(self.min_insync, self.replicas)
        return self.replicas // 2 + 1

    @property
    def delay_levels_ms(self) -> tuple[int, ...]:
        return parse_delay_levels(self.delay_levels)

    @field_validator("delay_levels")
    @classmethod
    def _validate_levels(cls, value: str) -> str:
        parse_delay_levels(value)  # ValueError → a settings error naming the bad part
        return value

    def store_config(self) -> StoreConfig:
        return StoreConfig(
            root=self.data_dir / "store",
            segment_bytes=self.segment_bytes,
            flush=self.flush,
            flush_interval_ms=self.flush_interval_ms,
            max_send_wait_ms=self.max_send_wait_ms,
            max_pending_bytes=self.max_pending_bytes,
            file_reserved_hours=self.file_reserved_hours,
            retention_interval_s=self.retention_interval_s,
            disk_high_water_ratio=self.disk_high_water_ratio,
            disk_full_ratio=self.disk_full_ratio,
            disk_min_free_bytes=self.disk_min_free_bytes,
            store_host=self.store_host,
        )

    @property
    def store_host(self) -> str:
        """``ip:port`` recorded in every stored record (IPv4: the record has 8 bytes for it)."""
        try:
            ip = str(ipaddress.IPv4Address(self.public_host))
        except ValueError:
            ip = "127.0.0.1"
        return f"{ip}:{self.port}"
