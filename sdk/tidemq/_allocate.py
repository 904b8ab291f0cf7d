"""Average allocation of a group's queues among its members (RocketMQ's "averagely" strategy).

Every member computes the same table from the same inputs: the members sorted, the queues
sorted by (broker name, topic, queue id). The queues are cut into one contiguous run per member,
in member order; when they do not divide evenly the first ``len(queues) % len(members)``
members get one queue more. With fewer queues than members the last members get none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from tidemq._exceptions import ConfigurationError

Q = TypeVar("Q")


def allocate_averagely(me: str, members: Sequence[str], queues: Sequence[Q]) -> list[Q]:
    """The queues of ``me``; ``members`` and ``queues`` must already be sorted."""
    if me not in members:
        raise ConfigurationError(f"consumer {me!r} is not among the members {list(members)}")
    if not queues:
        return []
    index = list(members).index(me)
    base, extra = divmod(len(queues), len(members))
    count = base + (1 if index < extra else 0)
    start = index * base + min(index, extra)
    return list(queues[start:start + count])


def allocation_table(members: Sequence[str], queues: Sequence[Q]) -> dict[str, list[Q]]:
    """Every member's queues (for logs, tools and tests)."""
    return {m: allocate_averagely(m, members, queues) for m in members}
