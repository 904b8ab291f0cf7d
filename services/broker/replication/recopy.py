"""A member of a replicated group whose log has damaged records copies them again.

Recovery skips a record whose bytes fail their CRC in a sealed segment and never serves it
(store/commitlog.py, ``CommitLog.skipped``): right for a broker with one copy, where nothing
better exists. A member of a replicated group has better: every acknowledged record is also on
the other copies. Serving a hole there would lose the record for every reader should this
member lead (the faults suite's damaged-files fault, then an election: ``lost`` 1, and a
replica missing a position the others hold: ``replica_divergence``).

So such a member cuts its log before the first damaged record, as it does for a diverged tail,
and follows its primary from there: the records come back byte for byte at the same offsets
and are dispatched into their queue positions again. Until its log is as long as before the
cut it does not run for primary (``BrokerRole.may_lead``), so a member left alone with a cut
log cannot lead the group and make the others drop what only they still hold.
"""

from __future__ import annotations

import asyncio
import logging

from tidemq_server.broker.replication.role import BrokerRole
from tidemq_server.broker.store.store import MessageStore

log = logging.getLogger(__name__)


async def recopy_damaged(store: MessageStore, role: BrokerRole) -> int:
    """Cut ``store``'s log before its first damaged record; the bytes cut."""
    damaged = store.log.damaged_at
    if not damaged:
        return 0
    at = min(damaged)  # the start of the first damaged entry: a record boundary
    old_end = store.log.write_offset
    removed = await store.truncate(at)
    await asyncio.to_thread(role.epochs.truncate, at)
    store.log.skipped, store.log.damaged_at = [], []
    role.recopy_from(old_end)
    log.warning("recovery: %d damaged entries from offset %d: cut %d bytes of commit log to "
                "copy them again from the primary; this member does not run for primary before "
                "its log reaches %d again", len(damaged), at, removed, old_end)
    return removed
