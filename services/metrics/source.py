"""``tidemq_events``: a PySpark Python streaming data source over ``TIDE_SYS_TRANS_EVENTS``.

::

    spark.dataSource.register(TransactionEventSource)
    events = (spark.readStream.format("tidemq_events")
              .option("broker_url", "http://127.0.0.1:10911").option("token", "...")
              .load())  # or .option("nameservers", "http://ns1:9876,http://ns2:9876")

Reads the topic through the broker's pull API queue by queue, on one broker (``broker_url``) or
on every broker group the nameservers list (``nameservers``: the list is asked again at each
micro-batch's planning, so a group that joins is read from then on, from its earliest event; a
group that does not answer is skipped for that batch and its queues stay where they were). A
source offset is the next queue offset of every queue of every group (``planning``), so Spark's
checkpoint holds our progress and a restarted query re-reads nothing it committed. Each batch
is split into ranges of at most ``partition_events`` offsets, one Spark task each; a task pulls
its range in bulk (up to 1024 records per request, bodies and offsets only, msgpack) from the
group's address found when the batch was planned, and yields one Arrow record batch per pull.
Supports ``Trigger.AvailableNow`` (the end is frozen when the query starts) and a read limit
(``max_events_per_batch``, shared fairly between queues).

Options (all strings, as Spark passes them):

=====================  ======================================================================
broker_url             base URL of the broker (required without nameservers)
nameservers            comma-separated nameserver URLs: read every broker group they list
token                  the cluster token, sent as ``X-Tidemq-Token`` ("" = none)
topic                  the event topic (default ``TIDE_SYS_TRANS_EVENTS``)
start                  ``earliest`` (default) or ``latest``: where a new query begins
max_events_per_batch   read limit of one micro-batch (events; 0 = unlimited; default 200000)
partition_events       offsets per Spark task (default 50000)
pull_max               records per pull (1-1024, default 1024)
timeout_s              HTTP timeout of one request (default 10)
=====================  ======================================================================
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType
from tidemq.protocol import SystemTopic

from tidemq_server.common.broker_client import BrokerDown
from tidemq_server.common.constants import METRICS_MAX_EVENTS_PER_BATCH
from tidemq_server.common.discovery import Nameservers, NoNameserver, fetch_groups, split_urls
from tidemq_server.metrics import planning
from tidemq_server.metrics.events import (
    COLUMNS,
    EVENTS,
    INT_BOUNDS,
    MAX_FIELD_CHARS,
    SCHEMA_DDL,
    SOURCES,
    parse_event,
)
from tidemq_server.metrics.planning import FIXED, Offsets
from tidemq_server.metrics.reader import MAX_PULL, TopicReader

log = logging.getLogger(__name__)

FORMAT = "tidemq_events"
_ARROW_TYPES = {"int": pa.int32(), "bigint": pa.int64(), "string": pa.string()}
ARROW_SCHEMA = pa.schema([(name, _ARROW_TYPES[kind]) for name, kind in COLUMNS])


@dataclass(frozen=True, slots=True)
class SourceOptions:
    broker_url: str
    nameservers: tuple[str, ...] = ()
    token: str = ""
    topic: str = SystemTopic.TRANS_EVENTS.value
    start: str = "earliest"
    max_events_per_batch: int = METRICS_MAX_EVENTS_PER_BATCH
    partition_events: int = 50_000
    pull_max: int = MAX_PULL
    timeout_s: float = 10.0

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        def get(name: str) -> str | None:
            value = options.get(name)
            return None if value is None or value == "" else str(value)

        url = get("broker_url") or ""
        nameservers = tuple(split_urls(get("nameservers") or ""))
        if not url and not nameservers:
            raise ValueError(f"the {FORMAT} source needs the option broker_url or nameservers")
        start = get("start") or "earliest"
        if start not in ("earliest", "latest"):
            raise ValueError(f"option start must be 'earliest' or 'latest', not {start!r}")
        pull_max = int(get("pull_max") or MAX_PULL)
        if not 1 <= pull_max <= MAX_PULL:
            raise ValueError(f"option pull_max must be 1-{MAX_PULL}, not {pull_max}")
        limit = get("max_events_per_batch")
        return cls(
            broker_url=url.rstrip("/"), nameservers=nameservers, token=get("token") or "",
            topic=get("topic") or SystemTopic.TRANS_EVENTS.value, start=start,
            max_events_per_batch=METRICS_MAX_EVENTS_PER_BATCH if limit is None else int(limit),
            partition_events=max(1, int(get("partition_events") or 50_000)),
            pull_max=pull_max, timeout_s=float(get("timeout_s") or 10.0),
        )

    def client(self, address: str = "", attempts: int | None = None) -> TopicReader:
        """A reader of the broker at ``address`` (the fixed broker_url when empty)."""
        return TopicReader(address or self.broker_url, self.token, self.topic, self.timeout_s,
                           attempts=attempts)


class RangePartition(InputPartition):
    """One Spark task: queue offsets ``[begin, end)`` of one queue of one broker."""

    def __init__(self, queue_id: int, begin: int, end: int, broker: str = FIXED,
                 address: str = "") -> None:
        super().__init__((broker, queue_id, begin, end))
        self.queue_id = queue_id
        self.begin = begin
        self.end = end
        self.broker = broker
        self.address = address


_JSON_SCHEMA = pa.schema([(name, _ARROW_TYPES[kind]) for name, kind in COLUMNS[2:-1]])
_JSON_PARSE = pa_json.ParseOptions(explicit_schema=_JSON_SCHEMA,
                                   unexpected_field_behavior="ignore")
_EVENT_SET = pa.array(sorted(EVENTS))
_SOURCE_SET = pa.array(sorted(SOURCES))


def _within(values: pa.Array, low: int, high: int) -> bool:
    bounds = pc.min_max(values)
    return bool(low <= bounds["min"].as_py() and bounds["max"].as_py() < high)


def _parse_vectorized(bodies: Sequence[bytes]) -> list[pa.Array] | None:
    """The event columns of a block of bodies parsed by Arrow's JSON reader in one call, or
    None when any body is not a valid event (the caller then parses body by body, which
    gives each bad one its reason). Same rules as ``events.validate_event``."""
    buffer = b"\n".join(bodies)
    if buffer.count(b"\n") != len(bodies) - 1:  # a raw newline inside a body
        return None
    try:
        table = pa_json.read_json(
            pa.BufferReader(buffer), parse_options=_JSON_PARSE,
            read_options=pa_json.ReadOptions(use_threads=False,
                                              block_size=max(1 << 20, len(buffer) + 1)))
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None
    if table.num_rows != len(bodies):
        return None
    cols = [table.column(name).combine_chunks() for name, _ in COLUMNS[2:-1]]
    if any(col.null_count for col in cols):
        return None
    event, source, group, topic, txid, mid, checks, born, ts = cols
    valid = (pc.all(pc.is_in(event, value_set=_EVENT_SET)).as_py()
             and pc.all(pc.is_in(source, value_set=_SOURCE_SET)).as_py()
             and all(_within(pc.utf8_length(c), 1, MAX_FIELD_CHARS + 1)
                     for c in (group, topic, txid))
             and _within(pc.utf8_length(mid), 0, MAX_FIELD_CHARS + 1)
             and all(_within(c, 0, bound)
                     for c, bound in zip((checks, born, ts), INT_BOUNDS, strict=True)))
    return cols if valid else None


def to_arrow(queue_id: int, offsets: Sequence[int], bodies: Sequence[bytes]) -> pa.RecordBatch:
    """Pulled bodies → one Arrow batch in ``COLUMNS`` order (parsed and validated): a block of
    valid events in one vectorized parse, otherwise body by body."""
    head: list[pa.Array] = [pa.array([queue_id] * len(offsets), type=pa.int32()),
                            pa.array(offsets, type=pa.int64())]
    fast = _parse_vectorized(bodies) if bodies else None
    if fast is not None:
        malformed = pa.nulls(len(bodies), type=pa.string())
        return pa.RecordBatch.from_arrays([*head, *fast, malformed], schema=ARROW_SCHEMA)
    parsed = [parse_event(body) for body in bodies]
    columns: list[Sequence[Any]] = (
        [list(col) for col in zip(*parsed, strict=True)] if parsed
        else [[] for _ in COLUMNS[2:]])
    arrays = [pa.array(col, type=field.type)
              for col, field in zip(columns, list(ARROW_SCHEMA)[2:], strict=True)]
    return pa.RecordBatch.from_arrays([*head, *arrays], schema=ARROW_SCHEMA)


class TransactionEventReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets and planning run in the driver's Python source process; ``read`` runs in the
    executors' Python workers on a pickled copy (hence the lazily opened clients)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.nameservers = Nameservers(options.nameservers)
        self._clients: dict[str, TopicReader] = {}  # broker name → reader (driver only)
        self.addresses: dict[str, str] = {}  # broker name → base URL, as last listed
        self._silent: set[str] = set()  # groups whose last look failed (logged once)
        self._legacy: str | None = None  # the group a one-broker checkpoint's offsets belong to
        self._target: Offsets | None = None  # Trigger.AvailableNow's end
        self._latest: Offsets = {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_clients"] = {}  # a connection does not travel to the executors
        return state

    # --- the groups and their queue ends (driver) ---------------------------------------------
    def groups(self) -> dict[str, str]:
        """Broker name → base URL of every group to read now: the fixed broker, or what the
        nameservers list (the groups listed before stay known when none answers)."""
        if not self.options.nameservers:
            return {FIXED: self.options.broker_url}
        try:
            found = fetch_groups(self.nameservers, self.options.timeout_s)
        except NoNameserver as exc:
            if not self.addresses:
                raise RuntimeError(f"{self.options.topic}: no nameserver answered ({exc})"
                                   ) from exc
            log.warning("%s: no nameserver answered (%s); reading the groups known before",
                        self.options.topic, exc)
            return dict(self.addresses)
        joined = sorted(set(found) - set(self.addresses))
        if joined:
            log.info("%s: reading broker group(s) %s", self.options.topic, ", ".join(joined))
        self.addresses.update({name: g.address for name, g in found.items()})
        return {name: self.addresses[name] for name in found}

    def _client(self, broker: str, address: str) -> TopicReader:
        client = self._clients.get(broker)
        if client is None or client.address != address:
            if client is not None:
                client.close()
            # one attempt per planning in a cluster: a group that is down is skipped at once
            attempts = 1 if self.options.nameservers else None
            client = self._clients[broker] = self.options.client(address, attempts)
        return client

    def ends(self) -> tuple[Offsets, Offsets]:
        """``({queue: min offset}, {queue: max offset})`` of every group that answered. With
        one fixed broker its failure is raised (the query restarts later); in a cluster a
        group that does not answer is left out, so its queues wait where they are."""
        mins: Offsets = {}
        maxes: Offsets = {}
        for broker, address in self.groups().items():
            try:
                lo, hi = self._client(broker, address).queue_offsets()
            except BrokerDown as exc:
                if not self.options.nameservers:
                    raise
                if broker not in self._silent:
                    log.warning("%s: broker %s does not answer (%s); its queues wait",
                                self.options.topic, broker, exc)
                    self._silent.add(broker)
                continue
            if broker in self._silent:
                log.info("%s: broker %s answers again", self.options.topic, broker)
                self._silent.discard(broker)
            mins.update({(broker, q): v for q, v in lo.items()})
            maxes.update({(broker, q): v for q, v in hi.items()})
        return mins, maxes

    def _offsets(self, spark_offset: dict[str, Any] | None) -> Offsets:
        """A Spark offset as queue offsets. In a cluster, the offsets of a one-broker checkpoint
        (broker name ``FIXED``) belong to the group found at ``broker_url``; without such a
        group they are dropped (that broker's events are read again from the start)."""
        offsets = planning.from_spark(spark_offset)
        if not self.options.nameservers or FIXED not in planning.brokers_of(offsets):
            return offsets
        if self._legacy is None:
            if not self.addresses:
                self.groups()
            owners = [n for n, url in self.addresses.items() if url == self.options.broker_url]
            self._legacy = owners[0] if owners else ""
            if owners:
                log.info("%s: the checkpoint's one-broker offsets belong to group %s (%s)",
                         self.options.topic, owners[0], self.options.broker_url)
            else:
                log.warning("%s: the checkpoint holds one-broker offsets but no group is at "
                            "broker_url %s: they are dropped", self.options.topic,
                            self.options.broker_url or "(none)")
        if self._legacy:
            return planning.rename(offsets, FIXED, self._legacy)
        return {k: v for k, v in offsets.items() if k[0] != FIXED}

    # --- Spark's calls --------------------------------------------------------------------------
    def initialOffset(self) -> dict[str, Any]:
        mins, maxes = self.ends()
        begin = maxes if self.options.start == "latest" else mins
        log.info("%s: new query starts at the %s offsets %s", self.options.topic,
                 self.options.start, begin)
        return planning.to_spark(begin)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_events_per_batch
        return ReadMaxRows(limit) if limit > 0 else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.ends()[1]
        log.info("%s: available-now run reads up to %s", self.options.topic, self._target)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = self._offsets(start)
        self._latest = planning.cap(self.ends()[1], self._target)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return planning.to_spark(planning.advance(begin, self._latest, max_rows))

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return planning.to_spark(self._latest) if self._latest else None

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, stop = self._offsets(start), self._offsets(end)
        missing = planning.brokers_of(stop) - set(self.addresses) - {FIXED}
        if missing:  # a batch planned before a restart: where are its groups now?
            self.groups()
        ranges = planning.split(begin, stop, self.options.partition_events, self.addresses)
        return [RangePartition(r.queue_id, r.begin, r.end, r.broker, r.address) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        rng = planning.QueueRange(partition.queue_id, partition.begin, partition.end,
                                  partition.broker, partition.address)
        with self.options.client(partition.address) as client:
            for offsets, bodies in client.read_range(rng, self.options.pull_max):
                yield to_arrow(rng.queue_id, offsets, bodies)

    def commit(self, end: dict[str, Any]) -> None:
        log.debug("%s: committed up to %s", self.options.topic, end)

    def stop(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients = {}


class TransactionEventSource(DataSource):
    """The ``tidemq_events`` format: one row per event (``events.COLUMNS``)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SCHEMA_DDL

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TransactionEventReader(SourceOptions.parse(self.options))
