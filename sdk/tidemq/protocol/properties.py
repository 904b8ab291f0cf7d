"""Names of the properties the system keeps inside stored records (the one place they are named).

A stored record carries a ``str → str`` property map. The names below are the system's own;
every value is text (numbers in decimal). A client never sees them: the broker strips them from
returned messages and the message parser refuses them as user property names.

Every name starting with ``RESERVED_PREFIX`` (``TIDE_``) belongs to the broker as well, named here
or not: no write door (JSON, msgpack, record batches, halves, gRPC) takes one from a client
(``is_reserved``). Some are shown to clients (``TIDE_CONSUME_FAILURE`` on retry and DLQ copies),
so returned messages lose only the names of ``RESERVED_PROPERTIES``.
"""

from __future__ import annotations

# --- every message ----------------------------------------------------------------------------
UNIQ_KEY = "UNIQ_KEY"  # the message id
TAGS = "TAGS"  # the message's tag
KEYS = "KEYS"  # the message's keys, joined by the store's key separator
SHARDING_KEY = "SHARDING_KEY"  # the key that picked the queue (same key, same queue)

# --- consumer retry ---------------------------------------------------------------------------
RETRY_TOPIC = "RETRY_TOPIC"  # original topic of a message in a retry or DLQ topic
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"  # reserved: RocketMQ's id of a retry's original
RECONSUME_TIME = "RECONSUME_TIME"  # reserved: RocketMQ's delivery attempt count
MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"  # per-message override of the broker's maximum

# --- delayed messages (waiting copies, and delays stashed on a half message) ------------------
REAL_TOPIC = "REAL_TOPIC"  # the topic a waiting or half copy is delivered/committed to
REAL_QID = "REAL_QID"  # ... and its queue id
DELAY = "DELAY"  # a delay level (1-based)
DELAY_MS = "DELAY_MS"  # a relative delay (ms), counted from commit on a half message
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"  # the delivery time (epoch ms)
TIDE_TIMER_ROLLS = "TIDE_TIMER_ROLLS"  # times a long timer was rolled back into the intake topic

# --- transactional messages -------------------------------------------------------------------
TRAN_MSG = "TRAN_MSG"  # "true" on every copy of a transactional message
PGROUP = "PGROUP"  # the producer group of a transactional message
TRANSACTION_ID = "TRANSACTION_ID"  # the transaction id (kept on the commit copy too)
TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"  # checks sent so far (half copies)
CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"  # own first-check delay (s)
BORN_MS = "BORN_MS"  # when the half message was first stored (epoch ms)

#: Every name above: user properties may not reuse them, returned messages never show them.
RESERVED_PROPERTIES = frozenset({
    UNIQ_KEY, TAGS, KEYS, SHARDING_KEY, RETRY_TOPIC, ORIGIN_MESSAGE_ID, RECONSUME_TIME,
    MAX_RECONSUME_TIMES, REAL_TOPIC, REAL_QID, DELAY, DELAY_MS, TIMER_DELIVER_MS, TIDE_TIMER_ROLLS,
    TRAN_MSG, PGROUP, TRANSACTION_ID, TRANSACTION_CHECK_TIMES, CHECK_IMMUNITY_TIME_IN_SECONDS,
    BORN_MS,
})

#: Property names starting with this belong to the broker: a client may not set one.
RESERVED_PREFIX = "TIDE_"


def is_reserved(name: str) -> bool:
    """Whether a client may not set the property ``name`` (a system name or ``TIDE_*``)."""
    return name in RESERVED_PROPERTIES or name.startswith(RESERVED_PREFIX)



def reserved_text(name: str) -> str:
    """Why the property ``name`` is refused (``is_reserved``), for the 400 naming it."""
    if name in RESERVED_PROPERTIES:
        return f"{name!r} is a reserved property name"
    return (f"{name!r} is a reserved property name: names starting with {RESERVED_PREFIX!r} "
            "belong to the broker")
