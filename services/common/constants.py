"""Every Redis key and cross-service default, in one place, each with its unit.

Redis keys are namespaced by cluster name: ``tidemq:{cluster}:...``. Build them only through
the functions here so that no other module spells a key.
"""

from __future__ import annotations

# --- ports (defaults) -------------------------------------------------------------------------
NAMESERVER_PORT = 9876
BROKER_PORT = 10911
BROKER_GRPC_PORT = 8081
METRICS_PORT = 9464
CHECKER_PORT = 10921  # checker's own /healthz and /metrics
SCHEDULER_PORT = 10931  # scheduler's internal API, /healthz and /metrics
CONSOLE_PORT = 8080  # the web console (HTML pages, /healthz, /metrics)
# etcd started by `tidemq up --replicas R` (R > 1): client port; its peer port is the next one
ETCD_PORT = 2379

# --- cross-service timings --------------------------------------------------------------------
BROKER_HEARTBEAT_INTERVAL_S = 30.0  # broker → nameserver
BROKER_EXPIRY_S = 120.0  # nameserver drops a broker silent this long
BROKER_HEARTBEAT_RETRY_S = 1.0  # broker → a nameserver that missed the last heartbeat (s)
CONSUMER_HEARTBEAT_INTERVAL_S = 10.0  # consumer → broker
CONSUMER_EXPIRY_S = 30.0  # broker drops a group member silent this long
PRODUCER_EXPIRY_S = 30.0  # broker sends no checks to a producer silent this long
OFFSET_COMMIT_INTERVAL_S = 5.0  # SDK push consumer commits offsets this often

# --- discovery: services that find broker groups through the nameservers (GET /v1/cluster) ---
CLUSTER_PATH = "/v1/cluster"  # the nameserver's list of every broker
DISCOVERY_REFRESH_S = 5.0  # a found group's address is asked again this often (s)
DISCOVERY_RETRY_S = 0.5  # after a failed call, ask again at most this often (s)
DISCOVERY_TIMEOUT_S = 2.0  # one request to one nameserver (s)
# a nameserver not answering this long is not waited for alone: the next is asked too (s)
DISCOVERY_HEDGE_S = 0.25
# a service's request to its group's primary still unanswered this long (past any long-poll
# wait) makes it ask the nameservers whether the group has another primary now, then again every
# DISCOVERY_RETRY_S; when it has, the request is abandoned and retried there (s)
MOVED_CHECK_S = 0.5
GRPC_ROUTE_CACHE_S = 3.0  # the gRPC door reuses the cluster view this long for routes (s)

TOKEN_HEADER = "X-Tidemq-Token"
ACL_CHECK_S = 1.0  # the ACL file's modification time is looked at this often at most (s)
# A send or pull carrying this header (any value) is answered with it too, holding the broker's
# CLOCK_MONOTONIC stamps (ns) of the request's steps: the latency bench's breakdown.
TIMING_HEADER = "X-Tidemq-Timing"

# --- broker groups ----------------------------------------------------------------------------
MAX_BROKER_ID = 1023  # highest member id of a broker group (0 = the primary)

# --- web console sessions (services/console/sessions.py) ---------------------------------------
CONSOLE_COOKIE = "tidemq_console"  # the session cookie's name (HttpOnly, SameSite=Strict)
CONSOLE_SESSION_TTL_S = 8 * 3600.0  # a console session (and its sign-in) lasts this long (s)
CONSOLE_SESSIONS_MAX = 10_000  # sessions kept in memory at most (the oldest are dropped)
CONSOLE_PENDING_MAX = 16  # confirmations one session may have waiting (the oldest dropped)

# every service refuses a request target (path and query) longer than this: 414 URI_TOO_LONG
MAX_URL_BYTES = 16 * 1024
#: How often the broker's lean door asks whether FastAPI's OpenTelemetry support is on (it
#: then hands every request to the app, which traces it) (s)
LEAN_TELEMETRY_CHECK_S = 1.0

# --- HTTP keep-alive --------------------------------------------------------------------------
HTTP_SERVER_KEEP_ALIVE_S = 5  # every service closes a connection idle this long (uvicorn, s)
# Clients drop a pooled connection idle this long (s). It must stay below the server's keep-alive:
# at equal values a request sent just as the server closes the idle connection gets no answer
# (httpx: RemoteProtocolError "Server disconnected without sending a response").
HTTP_CLIENT_KEEP_ALIVE_S = 2.0


# --- Redis high availability (services/common/redis.py) ----------------------------------------
REDIS_SENTINEL_PORT = 26379  # a sentinel's port when a redis+sentinel:// URL leaves it out
# a request caught by a failover retries against the master the sentinels name this long (s)
REDIS_FAILOVER_WAIT_S = 10.0
REDIS_FAILOVER_BACKOFF_MIN_S = 0.05  # first pause between two retries during a failover (s)
REDIS_FAILOVER_BACKOFF_MAX_S = 0.5  # longest pause between two retries (s)
# an offset commit waits for this many replicas to acknowledge it (WAIT): -1 = 1 when the master
# has a replica connected, else 0 (off)
REDIS_WAIT_REPLICAS = -1
REDIS_WAIT_TIMEOUT_MS = 1_000  # longest WAIT for the replicas of one commit batch (ms)
REDIS_REPLICA_CHECK_S = 5.0  # WAIT auto mode asks the master (ROLE) for its replicas this often (s)

# --- Redis keys ---------------------------------------------------------------------------------
# Redis Cluster safety: every multi-key operation (a MULTI pipeline, a Lua script) touches keys of
# one hash slot. Consumer state is per broker (group): queue ids are per broker, and several
# broker groups may share one Redis; its keys carry the hash tag ``{cluster:broker}``, so all of
# a broker's consumer state (offsets of every group, their index, simple-consumer state) is in
# one slot, and one commit batch of many groups is one transaction. Keys written by one
# single-key command at a time (checker and scheduler progress) need no tag.


def _ns(cluster: str) -> str:
    return f"tidemq:{cluster}"


def _broker_ns(cluster: str, broker_name: str) -> str:
    return f"tidemq:{{{cluster}:{broker_name}}}"


def _legacy_broker_ns(cluster: str, broker_name: str) -> str:
    return f"{_ns(cluster)}:{broker_name}"  # before the hash tag (renamed at broker start)


def consumer_offsets_key(cluster: str, broker_name: str, group: str, topic: str) -> str:
    """Hash: queue id → next offset to consume, for one (group, topic) on one broker."""
    return f"{_broker_ns(cluster, broker_name)}:offsets:{group}:{topic}"


def consumer_offsets_index_key(cluster: str, broker_name: str, group: str) -> str:
    """Set: topics with committed offsets for a group on one broker."""
    return f"{_broker_ns(cluster, broker_name)}:offset-topics:{group}"


def consumer_offsets_index_pattern(cluster: str, broker_name: str) -> str:
    """SCAN pattern matching every group's ``consumer_offsets_index_key`` on one broker (glob
    chars of the cluster and broker names escaped); a key minus
    ``consumer_offsets_index_key(cluster, broker_name, "")`` is its group."""
    return f"{_glob_escape(_broker_ns(cluster, broker_name))}:offset-topics:*"


def legacy_consumer_key_patterns(cluster: str, broker_name: str) -> list[tuple[str, str, str]]:
    """(SCAN pattern, old prefix, new prefix) for the consumer-state keys one broker wrote
    before its keys carried a hash tag: the broker renames them once at start."""
    old, new = _legacy_broker_ns(cluster, broker_name), _broker_ns(cluster, broker_name)
    escaped = _glob_escape(old)
    return [(f"{escaped}:{kind}:*", f"{old}:{kind}:", f"{new}:{kind}:")
            for kind in ("offsets", "offset-topics", "inflight", "receive-cursor")]


def _glob_escape(value: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in value)


def inflight_key(cluster: str, broker_name: str, group: str, topic: str) -> str:
    """Hash: receipt id → in-flight record of a simple consumer on one broker (visible-again
    time, offset)."""
    return f"{_broker_ns(cluster, broker_name)}:inflight:{group}:{topic}"


def receive_cursor_key(cluster: str, broker_name: str, group: str, topic: str) -> str:
    """Hash: queue id → next offset a simple consumer group has not yet handed out, on one
    broker."""
    return f"{_broker_ns(cluster, broker_name)}:receive-cursor:{group}:{topic}"


def service_progress_key(cluster: str, service: str) -> str:
    """Hash: progress field → value, for checker / scheduler (e.g. half and op offsets)."""
    return f"{_ns(cluster)}:progress:{service}"


# --- metrics sidecar (PySpark) ----------------------------------------------------------------
METRICS_SPARK_MASTER = "local[*]"  # Spark master of the metrics job (any master URL works)
METRICS_TRIGGER_INTERVAL_S = 5.0  # continuous mode: one micro-batch this often (s)
METRICS_MAX_EVENTS_PER_BATCH = 200_000  # read limit of one micro-batch (events)
METRICS_STALE_AFTER_S = 120.0  # liveness ages above this mean the metrics job stopped (s)
METRICS_EXPOSITION_FILE = "metrics.prom"  # exposition written by each batch, under the data dir


# --- delayed messages (broker ↔ scheduler) ----------------------------------------------------
SCHEDULER_FLOOR_OWNER = "scheduler"  # retention floor owner on the broker (intake + level queues)


def scheduler_progress_key(cluster: str, broker_name: str) -> str:
    """Hash, per broker the scheduler serves: ``intake`` → next timer-intake offset,
    ``level:{n}`` → next offset of level n's queue, ``level-intent:{n}`` → end offset of the
    level batch being delivered (a crash leaves it behind: that range is re-checked)."""
    return service_progress_key(cluster, f"scheduler:{broker_name}")


def scheduler_rebuild_key(cluster: str, broker_name: str) -> str:
    """Hash: ``floor`` → the timer-intake offset a scheduler rebuilding its timer log from the
    broker must read from so that every pending timer is covered (the oldest intake record a
    pending timer depends on; the broker's retention floor is held there)."""
    return f"{_ns(cluster)}:scheduler-rebuild:{broker_name}"



def scheduler_level_cancels_key(cluster: str, broker_name: str) -> str:
    """Hash: ``{queue id}:{queue offset}`` → ``{due_ms} {message_id}`` of cancelled
    delay-level messages not yet passed by the level walk."""
    return f"{_ns(cluster)}:scheduler-level-cancels:{broker_name}"


# the broker's bitmap of recent index key hashes, which spares the dedup check the on-disk index
# during the first dedup window after a start (services/broker/store/keyfilter.py)
KEY_FILTER_BITS = 1 << 26  # bits of the bitmap (8 MiB)
KEY_FILTER_SCAN_MAX = 2_000_000  # index entries read into it at start at most; more: no filter

LONG_POLL_MAX_MS = 30_000  # the longest wait_ms any broker endpoint accepts (ms)

# --- transactional messages (broker ↔ checker) -------------------------------------------------
# the checker scans at least this often; sooner when a half message falls due (ms)
TRANSACTION_CHECK_INTERVAL_MS = 30_000
# the checker scans and looks for new half messages at most this often (ms)
TRANSACTION_CHECK_MIN_SLEEP_MS = 200
# the checker wakes this long after the earliest due time (clock steps, timestamps in ms; ms)
TRANSACTION_CHECK_SLACK_MS = 20
TRANSACTION_TIMEOUT_MS = 6_000  # a half message is first checked after this (immunity, ms)
TRANSACTION_CHECK_MAX = 15  # checks sent before a half message is discarded
TRANSACTION_MAX_AGE_S = 72 * 3600.0  # a half message older than this is discarded (s)
PRODUCER_HEARTBEAT_INTERVAL_S = 10.0  # transactional producer → broker heartbeat (s)
CHECKER_FLOOR_OWNER = "checker"  # retention floor owner on the broker (half + op queues)


def checker_progress_key(cluster: str, broker_name: str) -> str:
    """Hash, per broker the checker serves: ``half`` → next half-queue offset to scan,
    ``op`` → next op-queue offset to read, ``op_from`` → the op-queue offset the ended ids it
    holds were read from (a restarted checker reads them again)."""
    return service_progress_key(cluster, f"checker:{broker_name}")


# bind addresses meaning "every interface": no address to give others (an advertised one is)
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
# names of this host only: the web console without ACL binds and answers on nothing else
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})

# --- logs (services/common/logs.py) ------------------------------------------------------------
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")  # a service's ..._LOG_LEVEL
LOG_FORMAT_ENV = "TIDEMQ_LOG_FORMAT"  # every service's and `tidemq up`'s log format
LOG_FORMATS = ("text", "json")  # text (the default): one readable line; json: one object a line
# A request's id in JSON logs: this header's value when the client sends one, else a new one.
REQUEST_ID_HEADER = "X-Request-Id"
