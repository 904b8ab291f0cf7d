"""A bitmap of the index's recent key hashes: "certainly not indexed since T" without the disk.

A send with a client-given id is checked for an earlier copy within the dedup window. While
the broker's memory of its own writes cannot be complete (the first window after a start: the
previous run's writes), that check asks the on-disk index, and almost always finds nothing —
~2 µs per record of hashing, slot reads and file walks, on every fresh broker.

``KeyFilter`` keeps one bit per hash value (modulo its size) of every index entry stored at or
after ``since_ms``: built once from the index files at start, then set by every later put, so it
mirrors the index exactly from ``since_ms`` on. A clear bit proves that no entry of that key
hash was indexed since then, and the index need not be read; a set bit (the key, or another
key whose hash shares the bit) sends the lookup to the index as before. It only ever answers
"maybe" more often than the index would, never "no" for a key the index holds.

Its bits fill as entries arrive; past ``max_adds`` a clear bit becomes rare, the filter stops
paying for itself and its owner drops it (lookups go to the index, as without it).
"""

from __future__ import annotations

from tidemq_server.common.constants import KEY_FILTER_BITS


class KeyFilter:
    """A bitmap of key hashes (crc32, as the index computes them) indexed at or after
    ``since_ms``."""

    __slots__ = ("adds", "bits", "mask", "max_adds", "since_ms")

    def __init__(self, since_ms: int, nbits: int = KEY_FILTER_BITS) -> None:
        if nbits < 8 or nbits & (nbits - 1):
            raise ValueError(f"a key filter's size is a power of two of at least 8 bits, "
                             f"not {nbits}")
        self.since_ms = since_ms
        self.mask = nbits - 1
        self.bits = bytearray(nbits >> 3)
        self.adds = 0
        # beyond this many hashes about one bit in eight is set: still useful, but no longer
        # cheap enough per lookup saved to keep the memory and the put's extra work
        self.max_adds = nbits >> 3

    def add(self, h: int) -> None:
        b = h & self.mask
        self.bits[b >> 3] |= 1 << (b & 7)
        self.adds += 1

    def add_all(self, hashes: list[int]) -> None:
        bits, mask = self.bits, self.mask
        for h in hashes:
            b = h & mask
            bits[b >> 3] |= 1 << (b & 7)
        self.adds += len(hashes)

    def may_hold(self, h: int) -> bool:
        """False: no key of hash ``h`` was indexed at or after ``since_ms``."""
        b = h & self.mask
        return bool(self.bits[b >> 3] >> (b & 7) & 1)

    @property
    def saturated(self) -> bool:
        return self.adds > self.max_adds
