"""Index: message keys and unique keys → commit log offsets, in memory-mapped hash files.

File layout (big-endian), named by the 20-digit store timestamp (ms) of its first entry::

    header   40 B   magic u32, version u32, begin_ms i64, end_ms i64, end_phys i64, count u32,
                    sealed u32 (1 once the file takes no more writes and its header is final)
    slots    slots x u32            index of the newest entry with that hash (0 = empty)
    entries  entries x 20 B         key hash u32, commit log offset i64, ms since begin i32,
                                    previous entry with the same slot u32

The file is created sparse and its pages are reserved with ``fallocate`` before they are
written through the mapping — the header and slots at once, entries ``RESERVE_ENTRIES`` at a
time — so a full disk answers ENOSPC to the reservation (an error the writer handles) and never
a SIGBUS to a write into the mapping (which kills the process).

Hashes collide, and entries may point at records that recovery later truncated and overwrote;
so every hit is verified by the caller against the record itself. The index is derived data,
rebuilt by re-dispatching from the checkpoint after a crash; duplicate entries are harmless.

The header's ``count`` is persisted with every checkpoint. After a crash, slots may point at
entries past that count (added after the checkpoint); opening an unsealed file walks such
slots back along ``prev`` to the persisted state, and re-dispatch adds those entries again.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import zlib
from pathlib import Path

from tidemq_server.broker.store.keyfilter import KeyFilter
from tidemq_server.broker.store.twin import cstore
from tidemq_server.common.constants import KEY_FILTER_SCAN_MAX

log = logging.getLogger(__name__)

HEADER = struct.Struct(">IIqqqII")
HEADER_SIZE = HEADER.size  # 40
SLOT = struct.Struct(">I")
SLOT_SIZE = SLOT.size  # 4
ENTRY = struct.Struct(">IqiI")  # hash, offset, ms since begin, previous entry
ENTRY_SIZE = ENTRY.size  # 20
INDEX_MAGIC = 0x7D1E_1D01
MAX_DELTA_MS = 2**31 - 1
MAX_CHAIN = 100_000  # a walk longer than this means a corrupt file
RESERVE_ENTRIES = 16_384  # entries whose pages are reserved ahead of use (320 KiB)


def key_hash(key: str) -> int:
    return zlib.crc32(key.encode("utf-8"))


UNIQUE_PREFIX = "U\0"  # a unique key (message id) in the index, apart from topic keys


def unique_key(message_id: str) -> str:
    return UNIQUE_PREFIX + message_id


def topic_key(topic: str, key: str) -> str:
    return topic + "\0" + key


def write_entry(mm: mmap.mmap, entries_at: int, slots: int, count: int, key: str, phys: int,
                delta: int) -> int:
    """Write entry number ``count`` (``key``'s hash, ``phys``, ``delta`` ms since the file's
    begin) chained to its slot's newest entry, and point the slot at it; the key's hash."""
    h = zlib.crc32(key.encode("utf-8"))
    slot_at = HEADER_SIZE + (h % slots) * SLOT_SIZE
    (prev,) = SLOT.unpack_from(mm, slot_at)
    ENTRY.pack_into(mm, entries_at + count * ENTRY_SIZE, h, phys, delta, prev)
    SLOT.pack_into(mm, slot_at, count)
    return h


def find_entries(mm: mmap.mmap, entries_at: int, slots: int, count: int, key: str,
                 low: int, high: int) -> list[int]:
    """The offsets of the entries (among the first ``count``) with ``key``'s hash whose delta
    is in [low, high], newest first, along the key's slot chain."""
    h = key_hash(key)
    (i,) = SLOT.unpack_from(mm, HEADER_SIZE + (h % slots) * SLOT_SIZE)
    out: list[int] = []
    steps = 0
    while 0 < i <= count and steps < MAX_CHAIN:
        eh, phys, delta, prev = ENTRY.unpack_from(mm, entries_at + i * ENTRY_SIZE)
        if eh == h and low <= delta <= high:
            out.append(phys)
        if prev >= i:
            break  # chains only point backwards; anything else is damage
        i, steps = prev, steps + 1
    return out


def write_entries(mm: mmap.mmap, entries_at: int, slots: int, first: int, keys: list[str],
                  phys: list[int], delta: int) -> list[int]:
    """``write_entry`` of each key at its offset, numbered from ``first`` (a batch's records,
    one call: the compiled twin takes the mapping once); their hashes."""
    return [write_entry(mm, entries_at, slots, first + i, key, at, delta)
            for i, (key, at) in enumerate(zip(keys, phys, strict=True))]


write_entry_py, find_entries_py = write_entry, find_entries  # the references (tests)
write_entries_py = write_entries
if cstore is not None:  # the compiled twins (_cstore.pyx), falling back on the references
    cstore.use_index(write_entry_py, find_entries_py, HEADER_SIZE, MAX_CHAIN)
    cstore.use_entries(write_entries_py)
    write_entry, find_entries = cstore.write_entry, cstore.find_entries
    write_entries = cstore.write_entries


class IndexFile:
    def __init__(self, path: Path, slots: int, entries: int, begin_ms: int | None = None) -> None:
        self.path = path
        self.slots = slots
        self.entries = entries
        size = HEADER_SIZE + slots * SLOT.size + (entries + 1) * ENTRY_SIZE
        fresh = not path.exists()
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if fresh or os.fstat(self.fd).st_size < size:
            os.ftruncate(self.fd, size)
        self.mm = mmap.mmap(self.fd, size)
        magic, _v, begin, end, end_phys, count, sealed = HEADER.unpack_from(self.mm, 0)
        if magic != INDEX_MAGIC:
            begin = begin_ms if begin_ms is not None else int(path.name)
            end, end_phys, count, sealed = begin, 0, 0, 0
            HEADER.pack_into(self.mm, 0, INDEX_MAGIC, 1, begin, end, end_phys, count, 0)
        self.begin_ms, self.end_ms, self.end_phys, self.count = begin, end, end_phys, count
        self.sealed = bool(sealed)
        self._entries_at = HEADER_SIZE + slots * SLOT.size
        self._reserved = 0  # entries whose pages are reserved on disk
        if not self.sealed:
            self.reserve(0)
        if not fresh and not self.sealed:
            self._roll_back_to_count()

    def reserve(self, more: int) -> None:
        """Make sure the pages of the next ``more`` entries (and the slots) exist on disk;
        OSError (ENOSPC) when the disk cannot hold them."""
        need = min(self.entries + 1, self.count + more + 1)
        if need <= self._reserved:
            return
        upto = min(self.entries + 1, need + RESERVE_ENTRIES)
        os.posix_fallocate(self.fd, 0, self._entries_at + upto * ENTRY_SIZE)
        self._reserved = upto

    def _roll_back_to_count(self) -> None:
        """Point every slot at its newest entry within ``count`` (see the module docstring)."""
        region = self.mm[HEADER_SIZE:self._entries_at]
        repaired = 0
        for n, (i,) in enumerate(SLOT.iter_unpack(region)):
            if i <= self.count:
                continue
            steps = 0
            while i > self.count and steps < MAX_CHAIN:
                if i > self.entries:
                    i = 0
                    break
                _, _, _, prev = ENTRY.unpack_from(self.mm, self._entries_at + i * ENTRY_SIZE)
                i = prev if prev < i else 0
                steps += 1
            SLOT.pack_into(self.mm, HEADER_SIZE + n * SLOT.size, i)
            repaired += 1
        if repaired:
            log.info("index %s: rolled %d slots back to the checkpointed %d entries",
                     self.path.name, repaired, self.count)

    def full(self, store_ms: int) -> bool:
        return self.count >= self.entries or store_ms - self.begin_ms > MAX_DELTA_MS

    def put(self, key: str, phys: int, store_ms: int) -> int:
        """Add an entry; its key hash."""
        if self.sealed:
            raise RuntimeError(f"index file {self.path.name} is sealed")
        if self.count + 1 >= self._reserved:
            self.reserve(1)
        count = self.count = self.count + 1
        delta = store_ms - self.begin_ms
        h = write_entry(self.mm, self._entries_at, self.slots, count, key, phys,
                        delta if delta > 0 else 0)
        if store_ms > self.end_ms:
            self.end_ms = store_ms
        if phys > self.end_phys:
            self.end_phys = phys
        return h

    def put_many(self, keys: list[str], phys: list[int], store_ms: int) -> list[int]:
        """``put`` of each key at its offset (the caller checked they fit); their hashes."""
        if self.sealed:
            raise RuntimeError(f"index file {self.path.name} is sealed")
        n = len(keys)
        if self.count + n >= self._reserved:
            self.reserve(n)
        first = self.count + 1
        self.count += n
        delta = store_ms - self.begin_ms
        hashes = write_entries(self.mm, self._entries_at, self.slots, first, keys, phys,
                               delta if delta > 0 else 0)
        if store_ms > self.end_ms:
            self.end_ms = store_ms
        top = max(phys, default=0)
        if top > self.end_phys:
            self.end_phys = top
        return hashes

    def hashes_since(self, since_ms: int) -> list[int]:
        """The key hashes of the entries stored at or after ``since_ms``."""
        if self.end_ms < since_ms or not self.count:
            return []
        start = self._entries_at + ENTRY_SIZE  # entry 0 is never used
        region = memoryview(self.mm)[start:start + self.count * ENTRY_SIZE]
        try:
            least = since_ms - self.begin_ms
            return [h for h, _, delta, _ in ENTRY.iter_unpack(region) if delta >= least]
        finally:
            region.release()

    def write_header(self) -> None:
        HEADER.pack_into(self.mm, 0, INDEX_MAGIC, 1, self.begin_ms, self.end_ms, self.end_phys,
                         self.count, int(self.sealed))

    def seal(self) -> None:
        """No more writes: make the header final, so reopening needs no roll-back."""
        self.sealed = True
        self.flush()

    def reopen(self) -> None:
        """Take writes again (the newest file, opened at start: its header is rewritten at
        the next flush)."""
        self.sealed = False

    def lookup(self, key: str, begin_ms: int, end_ms: int) -> list[int]:
        """Commit log offsets of entries with the key's hash in the time range, newest first."""
        return find_entries(self.mm, self._entries_at, self.slots, self.count, key,
                            begin_ms - self.begin_ms, end_ms - self.begin_ms)

    def flush(self) -> None:
        self.write_header()
        self.mm.flush()

    def close(self) -> None:
        try:
            self.sealed = True
            self.write_header()
            self.mm.close()
        finally:
            os.close(self.fd)


class Index:
    """The set of index files, newest last; new entries go to the newest."""

    def __init__(self, directory: Path, slots: int, entries: int) -> None:
        self.dir = directory
        self.slots = slots
        self.entries = entries
        self.files: list[IndexFile] = []
        self.filter: KeyFilter | None = None  # see keyfilter.py; set by track_recent

    def open(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        for path in sorted(p for p in self.dir.iterdir() if p.name.isdigit()):
            self.files.append(IndexFile(path, self.slots, self.entries))
        if self.files:
            self.files[-1].reopen()  # the newest file takes writes again

    def put(self, key: str, phys: int, store_ms: int) -> int:
        """Add an entry; its key hash."""
        last = self.files[-1] if self.files else None
        if last is not None and last.count < last.entries and \
                store_ms - last.begin_ms <= MAX_DELTA_MS:
            return last.put(key, phys, store_ms)
        return self._put_new_file(key, phys, store_ms, last)

    def put_unique(self, key: str, phys: int, store_ms: int) -> None:
        """``put`` of a unique key (a message id): the recent-key filter learns it too. Other
        keys skip the filter, since only unique keys are asked of it."""
        h = self.put(key, phys, store_ms)
        if (f := self.filter) is not None:
            f.add(h)
            self._drop_if_full(f)

    def put_unique_many(self, keys: list[str], phys: list[int], store_ms: int) -> None:
        """``put_unique`` of each unique key at its offset (a batch's message ids)."""
        last = self.files[-1] if self.files else None
        if last is not None and last.count + len(keys) <= last.entries and \
                store_ms - last.begin_ms <= MAX_DELTA_MS:
            hashes = last.put_many(keys, phys, store_ms)
            if (f := self.filter) is not None:
                f.add_all(hashes)
                self._drop_if_full(f)
            return
        for key, at in zip(keys, phys, strict=True):  # a new file on the way: one by one
            self.put_unique(key, at, store_ms)

    def _drop_if_full(self, f: KeyFilter) -> None:
        """A full recent-key filter is dropped: it would answer "maybe" for every key."""
        if f.saturated:
            self.filter = None
            log.info("index: the recent-key filter is full (%d keys); dedup checks read the "
                     "index again while they need it", f.adds)

    def _put_new_file(self, key: str, phys: int, store_ms: int, last: IndexFile | None) -> int:
        if last is None or last.full(store_ms):
            if last is not None:
                last.seal()
            name = f"{store_ms:020d}"
            if self.files and self.files[-1].path.name >= name:
                name = f"{int(self.files[-1].path.name) + 1:020d}"
            self.files.append(IndexFile(self.dir / name, self.slots, self.entries, store_ms))
        return self.files[-1].put(key, phys, store_ms)

    def track_recent(self, since_ms: int, scan_max: int = KEY_FILTER_SCAN_MAX) -> bool:
        """Keep a ``KeyFilter`` of every unique key indexed at or after ``since_ms``: from the
        files now (every key there: an entry does not say which kind it is), from each
        ``put_unique`` later. False (no filter) when more than ``scan_max`` entries would
        have to be read for it."""
        hashes: list[int] = []
        for f in reversed(self.files):
            hashes += f.hashes_since(since_ms)
            if len(hashes) > scan_max:
                log.info("index: more than %d keys indexed since %d; no recent-key filter",
                         scan_max, since_ms)
                return False
        filt = KeyFilter(since_ms)
        filt.add_all(hashes)
        self.filter = None if filt.saturated else filt
        return self.filter is not None

    def surely_absent(self, key: str, since_ms: int) -> bool:
        """True when no entry of the unique ``key`` was indexed at or after ``since_ms`` (the filter
        says so without the files); False: maybe, ask ``lookup``."""
        f = self.filter
        return f is not None and since_ms >= f.since_ms and not f.may_hold(key_hash(key))

    def lookup(self, key: str, begin_ms: int = 0, end_ms: int = 2**62) -> list[int]:
        """Distinct candidate offsets for ``key`` in the time range, newest first."""
        seen: set[int] = set()
        out: list[int] = []
        for f in reversed(self.files):
            if f.end_ms < begin_ms or f.begin_ms > end_ms:
                continue
            for phys in f.lookup(key, begin_ms, end_ms):
                if phys not in seen:
                    seen.add(phys)
                    out.append(phys)
        return out

    def flush(self) -> None:
        for f in self.files[-2:]:  # only the newest files take writes
            f.flush()

    def delete_before(self, min_phys: int) -> None:
        """Drop files whose every entry points below ``min_phys`` (never the newest)."""
        while len(self.files) > 1 and self.files[0].end_phys < min_phys:
            f = self.files.pop(0)
            f.close()
            f.path.unlink(missing_ok=True)
            log.info("retention: deleted index file %s", f.path.name)

    def close(self) -> None:
        for f in self.files:
            f.close()
        self.files.clear()
