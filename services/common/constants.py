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

# --- cross-service timings --------------------------------------------------------------------
BROKER_HEARTBEAT_INTERVAL_S = 30.0  # broker → nameserver
BROKER_EXPIRY_S = 120.0  # nameserver drops a broker silent this long
CONSUMER_HEARTBEAT_INTERVAL_S = 10.0  # consumer → broker
CONSUMER_EXPIRY_S = 30.0  # broker drops a group member silent this long
PRODUCER_EXPIRY_S = 30.0  # broker sends no checks to a producer silent this long
OFFSET_COMMIT_INTERVAL_S = 5.0  # SDK push consumer commits offsets this often

TOKEN_HEADER = "X-Tidemq-Token"


def _ns(cluster: str) -> str:
    return f"tidemq:{cluster}"


def consumer_offsets_key(cluster: str, group: str, topic: str) -> str:
    """Hash: queue id → next offset to consume, for one (group, topic)."""
    return f"{_ns(cluster)}:offsets:{group}:{topic}"


def consumer_offsets_index_key(cluster: str, group: str) -> str:
    """Set: topics with committed offsets for a group."""
    return f"{_ns(cluster)}:offset-topics:{group}"


def inflight_key(cluster: str, group: str, topic: str) -> str:
    """Hash: receipt id → in-flight record of a simple consumer (visible-again time, offset)."""
    return f"{_ns(cluster)}:inflight:{group}:{topic}"


def receive_cursor_key(cluster: str, group: str, topic: str) -> str:
    """Hash: queue id → next offset a simple consumer group has not yet handed out."""
    return f"{_ns(cluster)}:receive-cursor:{group}:{topic}"


def service_progress_key(cluster: str, service: str) -> str:
    """Hash: progress field → value, for checker / scheduler (e.g. half and op offsets)."""
    return f"{_ns(cluster)}:progress:{service}"
