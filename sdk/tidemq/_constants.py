"""SDK defaults, each with its unit. They mirror the service defaults (docs/api.md,
docs/operations.md#settings).

The SDK is installable on its own, so it does not import the services' constants module; the
values that must agree with the broker are named identically there.
"""

from __future__ import annotations

NAMESERVER_PORT = 9876
BROKER_PORT = 10911
# The nameserver URLs a client uses when given neither nameservers=... nor broker_url=...: one
# URL or several comma-separated, as the CLI reads the same variable.
NAMESERVER_URL_ENV = "TIDEMQ_NAMESERVER_URL"

CONSUMER_HEARTBEAT_INTERVAL_S = 10.0  # push consumer → broker heartbeat (and rebalance) period
CONSUMER_EXPIRY_S = 30.0  # the broker drops a member silent this long
OFFSET_COMMIT_INTERVAL_S = 5.0  # push consumer commits offsets this often (and on close)
ROUTE_REFRESH_INTERVAL_S = 30.0  # cached topic routes are refreshed this often

# A PEM file of CA certificates every client of the process verifies https:// servers against,
# instead of the default trust store ("" or unset = the default store). An environment variable,
# so that one setting reaches the SDK, the CLI and every service's internal clients alike.
TLS_CA_ENV = "TIDEMQ_TLS_CA"

REQUEST_TIMEOUT_S = 10.0  # one plain HTTP request, connect to last byte

# The retry policy's defaults (``RetryPolicy``): a retriable failure (no connection, a lost
# answer, 503 BUSY / UNAVAILABLE / NOT_PRIMARY / NOT_ENOUGH_REPLICAS / DISK_FULL, 500) is retried
# until one deadline, not a count of attempts: a broker restart or a primary election (a few
# seconds) never reaches the application.
RETRY_DEADLINE_S = 30.0  # no attempt starts later than this after the call began (s)
RETRY_INITIAL_BACKOFF_S = 0.05  # pause after the first failure (s), doubling per failure...
RETRY_MAX_BACKOFF_S = 1.0  # ... up to this (s); half of each pause is drawn at random (jitter)
RETRY_MAX_RETRY_AFTER_S = 30.0  # a server's Retry-After is honoured up to this (s)
# A send whose answer was lost (it may be stored) is retried on the same broker group, while that
# group keeps answering that way (slow, resets, 5xx; not "connection refused"), this long before
# it may move to another group (where a second copy could then be stored); at most half the
# deadline (s)
MAYBE_STORED_STICK_S = 10.0
# One client's HTTP connection pool (connections). Every held long poll takes a connection, so
# the cap must exceed a consumer's queues. Note: httpcore 1.0 closes an idle connection whenever
# the pool holds more connections *in all* than the keep-alive figure (it counts all, not idle
# ones); raising it to the cap was measured and did not win (the pool's per-request scan grows
# with every connection kept), so it stays where it was.
HTTP_MAX_CONNECTIONS = 256
HTTP_MAX_KEEPALIVE_CONNECTIONS = 64
NAMESERVER_TIMEOUT_S = 3.0  # one route lookup on one nameserver (a dead one costs this much)
# a route lookup not answered this long asks the next nameserver too (s): far above a healthy
# nameserver's answer (~1 ms), far below NAMESERVER_TIMEOUT_S
NAMESERVER_HEDGE_S = 0.25

# A broker (group) that failed a request is avoided this long, doubling with each failure in a
# row up to the cap; then one request probes it (producers) or its queues are tried again
# (consumers). A success forgets the failures.
BROKER_BACKOFF_INITIAL_S = 0.5
PRODUCER_BROKER_BACKOFF_MAX_S = 10.0
CONSUMER_BROKER_BACKOFF_MAX_S = 5.0
# While a replicated group elects a new primary (its primary is unreachable or answers
# NOT_PRIMARY / NOT_ENOUGH_REPLICAS), a send asks for its route again this often, within the
# retry policy's deadline rather than its attempt count (s)
PRIMARY_WAIT_POLL_S = 0.25
# A send or cancel to a replicated group's primary still unanswered this long makes the client
# ask for the route again (then every PRIMARY_WAIT_POLL_S); once it names another primary the
# request is given up and retried there (tidemq._moved) (s)
MOVED_CHECK_S = 0.5
LONG_POLL_MAX_WAIT_MS = 30_000  # the broker holds a pull at most this long
PULL_WAIT_MS = 20_000  # push consumer long-poll wait per pull
RECEIVE_WAIT_MS = 20_000  # simple consumer long-poll wait per receive
INVISIBLE_MS = 30_000  # simple consumer invisibility of a received message

MAX_RECONSUME_TIMES = 16  # attempts before the broker sends a message to the DLQ
ORDERLY_RETRY_PAUSE_S = 1.0  # ordered mode: pause before a failed message is tried again
LOCAL_RETRY_PAUSE_S = 5.0  # a failed message whose retry call failed is consumed again after this
CONSUME_TIMEOUT_S = 900.0  # a handler running longer is cancelled and counts as a failure
HANDLER_WATCH_MAX_S = 1.0  # the handler watchdog looks at least this often (and every timeout/4)
# Pulled messages waiting for a handler before the consumer holds back its next poll (messages):
# each queue's max_span bounds it too; this bounds a consumer with very many queues
HANDLER_WAITING_CAP = 4096
CLOSE_TIMEOUT_S = 10.0  # close() waits this long for in-flight sends or handlers
REBALANCE_DRAIN_S = 3.0  # a revoked queue's handlers get this long before its offset is committed

SEND_LINGER_MS = 5.0  # a send waits at most this long for an outstanding request to answer (ms)
MESSAGE_OVERHEAD_BYTES = 64  # estimated wire overhead per message when sizing a batch
