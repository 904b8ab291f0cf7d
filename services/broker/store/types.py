"""Value types of the store: what goes in, what comes out, and the status enums.

Expected outcomes are enums inside result objects; bugs are exceptions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntFlag, StrEnum

from tidemq.protocol import KEYS, TAGS, UNIQ_KEY
from tidemq.protocol.records.v2 import KEY_SEPARATOR as KEY_SEPARATOR
from tidemq.protocol.records.v2 import tag_code as tag_code  # the consume queue's tag slot value

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


class SysFlag(IntFlag):
    """Transaction type bits of a record (RocketMQ's sysFlag, the parts tidemq uses)."""

    NONE = 0
    PREPARED = 0x4  # half message: never dispatched into a real topic's queue
    COMMIT = 0x8  # a committed transactional message re-put into its real topic
    ROLLBACK = 0xC  # rolled back: never dispatched into a real topic's queue
    TYPE_MASK = 0xC


class PutStatus(StrEnum):
    OK = "ok"  # written (and flushed, under flush=sync)
    BUSY = "busy"  # flow control: write queue too deep or its head waited too long
    DISK_FULL = "disk_full"  # disk past the full mark and nothing deletable
    UNAVAILABLE = "unavailable"  # store closed or in a sticky error state: nothing written
    WRITE_FAILED = "write_failed"  # the write or fsync covering it failed: part may be stored
    TOO_LARGE = "too_large"  # a record larger than a commit log segment can hold
    INVALID = "invalid"  # a record field its slot in the layout cannot hold (record.validate_fits)
    NOT_PRIMARY = "not_primary"  # replication: this broker may not write (nothing written)
    NOT_ENOUGH_REPLICAS = "not_enough_replicas"  # replication: too few in-sync copies


class GetStatus(StrEnum):
    FOUND = "found"  # at least one message
    NO_MATCHED = "no_matched"  # units scanned but none passed the tag filter
    NO_MESSAGE = "no_message"  # offset == max_offset: nothing yet (long poll here)
    OFFSET_TOO_SMALL = "offset_too_small"  # read from min_offset instead
    OFFSET_OVERFLOW = "offset_overflow"  # offset > max_offset
    NO_QUEUE = "no_queue"  # queue never written (treated as empty, min = max = 0)


@dataclass(slots=True)
class MessageRecord:
    """One record to append. ``properties`` carries UNIQ_KEY (message_id), TAGS, KEYS, ..."""

    topic: str
    queue_id: int
    body: bytes
    properties: dict[str, str] = field(default_factory=dict)
    tag_code: int = 0  # consume-queue tag slot (delivery time in ms for delay-level queues)
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0  # ms since epoch
    born_host: str = "127.0.0.1:0"
    reconsume_times: int = 0
    prepared_tx_offset: int = 0  # for COMMIT/ROLLBACK: physical offset of the half message


@dataclass(slots=True)
class Appended:
    """Where one record landed."""

    physical_offset: int
    size: int
    queue_id: int
    queue_offset: int
    store_timestamp: int


@dataclass(slots=True)
class PutResult:
    status: PutStatus
    appended: list[Appended] = field(default_factory=list)
    message: str = ""


@dataclass(slots=True)
class StoredRecord:
    """A record read back from the commit log (CRC verified)."""

    physical_offset: int
    size: int
    topic: str
    queue_id: int
    queue_offset: int
    body: bytes
    properties: dict[str, str]
    flag: int
    sys_flag: int
    born_timestamp: int
    born_host: str
    store_timestamp: int
    store_host: str
    reconsume_times: int
    prepared_tx_offset: int

    @property
    def message_id(self) -> str:
        return self.properties.get(UNIQ_KEY, "")

    @property
    def tag(self) -> str | None:
        return self.properties.get(TAGS) or None

    @property
    def keys(self) -> list[str]:
        raw = self.properties.get(KEYS)
        return raw.split(KEY_SEPARATOR) if raw else []


@dataclass(slots=True)
class GetResult:
    status: GetStatus
    records: list[StoredRecord]
    next_offset: int
    min_offset: int
    max_offset: int
    stored: bytes = b""  # a stored-form read (get_stored): the records as the log holds them
    count: int = 0  # ... and how many

    @property
    def found(self) -> int:
        """How many records the read answers, in either form."""
        return len(self.records) or self.count

