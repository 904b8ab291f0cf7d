"""Consumer offsets in Redis: ``(group, topic, queue) → next offset to consume``, per broker.

Queue ids are per broker and several broker groups may share one Redis, so every key carries
this broker's name (``broker_name``) after the cluster's: two groups never see each other's
offsets, and a consumer's offsets are per (group, topic, broker, queue).

A commit is answered only once Redis has it. Many requests commit at once (every push consumer
every 5 s), so commits are not sent one by one: ``commit`` queues the change and waits on a
future; one writer task drains everything queued, sends it as one pipeline (one round trip) and
resolves the futures. Resets and group deletes travel the same queue, so they apply in order with
the commits around them.

Durable means replicated when Redis has replicas: the batch goes as ``MULTI … EXEC`` followed
by ``WAIT n timeout`` on the same connection, in one round trip, and the requests are answered only
once ``n`` replicas have it (``wait_replicas``: -1 = 1 when the master has a replica connected,
as its ``ROLE`` says; 0 = never wait). A batch the replicas did not confirm in time fails with
``UNAVAILABLE`` (it is applied on the master; a retried commit writes the same values again), so
a Sentinel failover, which promotes the replica with the most data, loses no answered commit.
Under Sentinel a master found without a replica (by ROLE, or by a WAIT that timed out) is checked
against the sentinels: one they no longer name (cut off, or demoted by a switchover and not yet
reconfigured) is left for the one they name, so no commit is answered on a stale master's word.

Redis down → ``ProtocolError(UNAVAILABLE)`` within the socket timeout; the client reconnects on
its own when Redis is back, and a failed batch only fails the requests in it (the writer lives on).
Under Sentinel (services/common/redis.py) a connection error or READONLY reply sends the whole
batch again to the master the sentinels name, for up to the URL's ``failover_wait_s``: every
command in it sets values (HSET, SADD, SREM, DEL), so applying it twice is applying it once.

A commit with ``advance_only`` (what consumers send) only moves an offset forward: a script sets
each queue's offset only when it is higher, so a commit held up behind a partition and written
late — the broker retries a batch for up to ``failover_wait_s`` — cannot put the group back behind
a newer commit (the faults suite saw offsets go back from 44 to 31 that way). A plain commit sets
the offsets as given (an operator's reset).

Keys (services/common/constants.py): ``consumer_offsets_key`` (hash queue id → offset) per
(broker, group, topic), ``consumer_offsets_index_key`` (set of topics) per (broker, group); both
carry the broker's hash tag, so a batch of many groups is one Redis Cluster slot.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.typing import EncodableT
from tidemq.protocol import ErrorCode, ProtocolError

from tidemq_server.common.constants import (
    REDIS_REPLICA_CHECK_S,
    REDIS_WAIT_REPLICAS,
    REDIS_WAIT_TIMEOUT_MS,
    consumer_offsets_index_key,
    consumer_offsets_index_pattern,
    consumer_offsets_key,
    legacy_consumer_key_patterns,
)
from tidemq_server.common.loop import cancel_tasks
from tidemq_server.common.redis import REDIS_TIMEOUT_S, NotReplicated, connect_redis, text

log = logging.getLogger(__name__)

MAX_BATCH = 1024  # commits sent in one pipeline at most
#: HSET of (queue id, offset) pairs, each only when higher than the stored offset
RAISE_ONLY = """
for i = 1, #ARGV, 2 do
  local current = redis.call('HGET', KEYS[1], ARGV[i])
  if not current or tonumber(current) < tonumber(ARGV[i + 1]) then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
return 0
"""
SCAN_COUNT = 500  # keys Redis looks at per SCAN step when listing groups
MIGRATE_RETRY_S = 2.0  # renaming pre-hash-tag keys is tried again this often until Redis answers


def unavailable(what: str, exc: BaseException) -> ProtocolError:
    """The error a request gets when Redis cannot be reached (or answers with an error)."""
    if isinstance(exc, NotReplicated):
        return ProtocolError(ErrorCode.UNAVAILABLE, f"{what}: {exc}; retry later")
    return ProtocolError(ErrorCode.UNAVAILABLE,
                         f"{what}: Redis unreachable ({type(exc).__name__}: {exc}); retry later")


Command = tuple[EncodableT, ...]  # one Redis command: name, key, arguments


@dataclass(slots=True)
class _Pending:
    commands: list[Command]  # this request's writes, sent inside the batch's MULTI
    done: asyncio.Future[None]


class OffsetStore:
    """Committed consumer offsets, with concurrent commits coalesced into one round trip."""

    def __init__(self, redis_url: str, cluster: str, broker_name: str, *,
                 client: Redis | None = None, timeout_s: float = REDIS_TIMEOUT_S,
                 wait_replicas: int = REDIS_WAIT_REPLICAS,
                 wait_timeout_ms: int = REDIS_WAIT_TIMEOUT_MS) -> None:
        self.cluster = cluster
        self.broker_name = broker_name
        self._redis = client if client is not None else connect_redis(redis_url, timeout_s)
        self._owns_client = client is None
        self._timeout_s = timeout_s
        self.wait_replicas = wait_replicas  # -1: 1 when the master has a replica, else 0
        self.wait_timeout_ms = wait_timeout_ms
        self._replicas_seen = 0  # replicas the master listed at the last ROLE (auto mode)
        self._replicas_checked = -1.0  # monotonic time of that ROLE (-1: never)
        self._replicas_of: tuple[str, int] | None = None  # the server that answered it
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None
        self._migrator: asyncio.Task[None] | None = None
        self._closed = False
        self.round_trips = 0  # batches sent by the writer (tests and metrics read it)
        self.commits = 0  # commit/reset/delete requests written
        self.migrated = 0  # keys renamed from their pre-hash-tag names

    @property
    def redis(self) -> Redis:
        return self._redis

    def _key(self, group: str, topic: str) -> str:
        return consumer_offsets_key(self.cluster, self.broker_name, group, topic)

    def _index(self, group: str) -> str:
        return consumer_offsets_index_key(self.cluster, self.broker_name, group)

    async def start(self) -> None:
        if self._writer is None:
            self._closed = False
            self._writer = asyncio.create_task(self._write_loop(), name="offset-writer")
        if self._migrator is None:
            self._migrator = asyncio.create_task(self._migrate_loop(), name="offset-key-rename")

    async def close(self) -> None:
        self._closed = True
        await cancel_tasks(self._writer, self._migrator)
        self._writer = self._migrator = None
        while not self._queue.empty():
            pending = self._queue.get_nowait()
            _fail(pending.done, ProtocolError(ErrorCode.UNAVAILABLE, "offset store closed"))
        if self._owns_client:
            await self._redis.aclose()

    # --- writes: queued for the writer task --------------------------------------------------

    async def commit(self, group: str, offsets: list[tuple[str, int, int]], *,
                     advance_only: bool = False) -> None:
        """Store (topic, queue id, next offset) triples; returns once Redis has them. With
        ``advance_only`` an offset lower than the stored one is left alone."""
        by_topic: dict[str, dict[str, int]] = {}
        for topic, queue_id, offset in offsets:
            if queue_id < 0 or offset < 0:
                raise ProtocolError(ErrorCode.BAD_REQUEST,
                                    f"offset {offset} for {topic} queue {queue_id}: "
                                    "queue id and offset must be >= 0")
            by_topic.setdefault(topic, {})[str(queue_id)] = offset
        if by_topic:
            await self._submit(self.commit_commands(group, by_topic, advance_only))

    def commit_commands(self, group: str, by_topic: dict[str, dict[str, int]],
                        advance_only: bool = False) -> list[Command]:
        """The writes of one commit: topic → {queue id: offset}."""
        commands: list[Command] = [
            ("EVAL", RAISE_ONLY, 1, self._key(group, topic), *_flat(mapping)) if advance_only
            else ("HSET", self._key(group, topic), *_flat(mapping))
            for topic, mapping in by_topic.items()]
        commands.append(("SADD", self._index(group), *by_topic))
        return commands

    async def reset(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        """Replace a (group, topic)'s offsets with exactly ``offsets`` (empty: forget the topic)."""
        await self._submit(self.reset_commands(group, topic, offsets))

    def reset_commands(self, group: str, topic: str, offsets: dict[int, int]) -> list[Command]:
        key = self._key(group, topic)
        commands: list[Command] = [("DEL", key)]
        if offsets:
            commands.append(("HSET", key, *_flat({str(q): o for q, o in offsets.items()})))
            commands.append(("SADD", self._index(group), topic))
        else:
            commands.append(("SREM", self._index(group), topic))
        return commands

    async def delete_group(self, group: str) -> None:
        """Forget every committed offset of a group."""
        await self._submit(self.delete_commands(group, await self.topics(group)))

    def delete_commands(self, group: str, topics: list[str]) -> list[Command]:
        return [("DEL", *(self._key(group, t) for t in topics), self._index(group))]

    # --- reads: straight to Redis ------------------------------------------------------------

    async def get(self, group: str, topic: str) -> dict[int, int]:
        """Committed offsets of a (group, topic): queue id → next offset ({} when none)."""
        try:
            raw = await self._redis.hgetall(self._key(group, topic))
        except (RedisError, OSError) as exc:
            raise unavailable(f"reading offsets of {group}/{topic}", exc) from exc
        return {int(text(q)): int(text(o)) for q, o in raw.items()}

    async def get_many(self, group: str, topics: list[str]) -> list[dict[int, int]]:
        """``get`` for several topics of a group in one pipelined round trip."""
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for topic in topics:
                    pipe.hgetall(self._key(group, topic))
                raws = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise unavailable(f"reading offsets of group {group}", exc) from exc
        return [{int(text(q)): int(text(o)) for q, o in raw.items()} for raw in raws]

    async def topics(self, group: str) -> list[str]:
        """Topics the group has committed offsets for, sorted."""
        try:
            raw = await self._redis.smembers(self._index(group))
        except (RedisError, OSError) as exc:
            raise unavailable(f"reading topics of group {group}", exc) from exc
        return sorted(text(t) for t in raw)

    async def groups(self) -> dict[str, list[str]]:
        """Every group with committed offsets → its topics, sorted (a SCAN of the index keys,
        then one pipelined read: an admin listing, not a hot path)."""
        prefix = self._index("")
        pattern = consumer_offsets_index_pattern(self.cluster, self.broker_name)
        try:
            keys = [text(k) async for k in self._redis.scan_iter(match=pattern,
                                                                 count=SCAN_COUNT)]
            async with self._redis.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.smembers(key)
                members = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise unavailable("listing consumer groups", exc) from exc
        found = {key[len(prefix):]: sorted(text(t) for t in topics)
                 for key, topics in zip(keys, members, strict=True)}
        return {group: found[group] for group in sorted(found) if found[group]}

    # --- the writer --------------------------------------------------------------------------

    async def _submit(self, commands: list[Command]) -> None:
        # Enqueued before the first await: writes reach Redis in the order they were submitted.
        if self._closed:
            raise ProtocolError(ErrorCode.UNAVAILABLE, "offset store is closed")
        if self._writer is None or self._writer.done():  # not started yet (or died): start it
            self._writer = asyncio.create_task(self._write_loop(), name="offset-writer")
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Pending(commands, done))
        # shield: a cancelled request must not cancel the future the writer resolves.
        await asyncio.shield(done)

    async def _write_loop(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < MAX_BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                await self._write(batch)
            except asyncio.CancelledError:
                for pending in batch:
                    _fail(pending.done, ProtocolError(ErrorCode.UNAVAILABLE, "offset store closed"))
                raise
            except (RedisError, OSError) as exc:
                log.warning("offset commit of %d request(s) failed: %s: %s",
                            len(batch), type(exc).__name__, exc)
                err = unavailable("committing offsets", exc)
                for pending in batch:
                    _fail(pending.done, err)
            except Exception as exc:  # a bug: fail these requests, keep the writer alive
                log.exception("offset commit of %d request(s) failed", len(batch))
                for pending in batch:
                    _fail(pending.done, ProtocolError(ErrorCode.INTERNAL_ERROR,
                                                      f"offset commit failed: {exc}"))
            else:
                for pending in batch:
                    if not pending.done.done():
                        pending.done.set_result(None)

    async def _write(self, batch: list[_Pending]) -> None:
        """One transaction for the batch, then WAIT for the replicas, on one connection in one
        round trip (WAIT counts the writes of its own connection)."""
        commands = [c for pending in batch for c in pending.commands]
        pool = self._redis.connection_pool
        conn = await pool.get_connection()
        try:
            await conn.retry.call_with_retry(lambda: self._transact(conn, commands),
                                             lambda _error: conn.disconnect())
        finally:
            await pool.release(conn)
        self.commits += len(batch)

    async def _transact(self, conn: AbstractConnection, commands: list[Command]) -> None:
        try:
            replicas = await self._replicas_wanted(conn)
            wait: list[Command] = [("WAIT", replicas, self.wait_timeout_ms)] if replicas else []
            self.round_trips += 1
            await conn.send_packed_command(
                conn.pack_commands([("MULTI",), *commands, ("EXEC",), *wait]))
            await conn.read_response()  # OK
            for _ in commands:
                await conn.read_response()  # QUEUED (or the error that aborts the EXEC)
            for result in await conn.read_response() or []:
                if isinstance(result, ResponseError):
                    raise result
            if wait:
                acked = int(await conn.read_response(
                    timeout=self._timeout_s + self.wait_timeout_ms / 1000))
                if acked < replicas:
                    self._replicas_checked = -1.0  # ask the master again before the next batch
                    if await self._master_moved(conn):
                        raise RedisConnectionError(f"{_address(conn)} lost its replica and the "
                                                   "sentinels name another master")
                    raise NotReplicated(f"written to the Redis master but acknowledged by "
                                        f"{acked} of {replicas} replica(s) within "
                                        f"{self.wait_timeout_ms} ms")
        except BaseException:
            self._replicas_checked = -1.0  # maybe another master now: ask again
            await conn.disconnect()  # unread replies may be left: never reuse this connection
            raise

    async def _replicas_wanted(self, conn: AbstractConnection) -> int:
        """Replicas a batch waits for: the setting, or in auto mode (-1) 1 when the master's
        ROLE lists a replica (asked every ``REDIS_REPLICA_CHECK_S`` and after a failure)."""
        if self.wait_replicas >= 0:
            return self.wait_replicas
        now = time.monotonic()
        if (self._replicas_checked < 0 or now - self._replicas_checked >= REDIS_REPLICA_CHECK_S
                or not conn.is_connected or self._replicas_of != _address(conn)):
            await conn.send_command("ROLE")  # connects first when needed (to the master now)
            role = await conn.read_response()
            self._replicas_seen = len(role[2]) if text(role[0]) == "master" else 0
            self._replicas_checked, self._replicas_of = now, _address(conn)
            if self._replicas_seen == 0 and await self._master_moved(conn):
                # a master cut off from its replica, or demoted by a switchover, keeps taking
                # writes until the sentinels reconfigure it; never answer on its word alone
                self._replicas_checked = -1.0
                raise RedisConnectionError(f"{_address(conn)} has no replica and the sentinels "
                                           "name another master")
        return min(1, self._replicas_seen)

    async def _master_moved(self, conn: AbstractConnection) -> bool:
        """Under Sentinel: do the sentinels name another master than ``conn``'s (or none, a
        failover being under way)? Always False for a plain ``redis://`` URL."""
        sentinels = getattr(self._redis, "sentinels", None)
        pool = self._redis.connection_pool
        if sentinels is None or not isinstance(pool, SentinelConnectionPool):
            return False
        try:
            host, port = await sentinels.discover_master(pool.service_name)
        except RedisConnectionError:
            return True
        return (str(host), int(port)) != _address(conn)

    # --- keys written before the hash tag ------------------------------------------------------

    async def _migrate_loop(self) -> None:
        while True:
            try:
                self.migrated += await self.migrate_legacy_keys()
                return
            except (RedisError, OSError) as exc:
                log.warning("renaming pre-hash-tag offset keys failed (%s); retrying in %.0fs",
                            exc, MIGRATE_RETRY_S)
                await asyncio.sleep(MIGRATE_RETRY_S)

    async def migrate_legacy_keys(self) -> int:
        """Rename this broker's consumer-state keys from their names before the hash tag
        (``tidemq:{cluster}:{broker}:…``) to the tagged ones; a key whose new name exists
        already is newer state and wins. Returns how many were renamed."""
        renamed = 0
        for pattern, old, new in legacy_consumer_key_patterns(self.cluster, self.broker_name):
            async for raw in self._redis.scan_iter(match=pattern, count=SCAN_COUNT):
                key = text(raw)
                if not key.startswith(old):
                    continue
                try:
                    renamed += bool(await self._redis.renamenx(key, new + key[len(old):]))
                except ResponseError as exc:  # e.g. CROSSSLOT on Redis Cluster: leave it
                    log.warning("cannot rename %s to its hash-tagged name: %s", key, exc)
        if renamed:
            log.info("renamed %d consumer-state key(s) of broker %s to their hash-tagged names",
                     renamed, self.broker_name)
        return renamed


def _address(conn: AbstractConnection) -> tuple[str, int] | None:
    """Host and port of a TCP connection (a failover changes them under Sentinel)."""
    host, port = getattr(conn, "host", None), getattr(conn, "port", None)
    return (str(host), int(port)) if host is not None and port is not None else None


def _flat(mapping: dict[str, int]) -> list[EncodableT]:
    return [item for pair in mapping.items() for item in pair]


def _fail(done: asyncio.Future[None], exc: BaseException) -> None:
    if not done.done():
        done.set_exception(exc)
        done.exception()  # mark retrieved: a request that went away must not log "never retrieved"
