"""The fetch answer as the raw chunk: the log bytes are the body, the rest is in headers.

The msgpack answer wraps the chunk in a map with a dozen small fields; a replica then pays for
encoding on the primary and decoding (a copy of every byte) on its side at every fetch, which
at the log end is every group commit. Asked for ``CONTENT_CHUNK`` the primary answers the
bytes as they are and the fields as ``x-tidemq-fetch-*`` headers (numbers in decimal, the epoch
history as ``epoch:start,...``, retention floors as ``owner=offset,...`` with the owner and
the metadata version percent-encoded).

Rolling upgrades keep working both ways: a replica asks for the chunk form first and msgpack
second (``FETCH_ACCEPT``) and reads whichever content type comes back, so an older primary
(which only looks for "msgpack" in ``accept``) answers msgpack; an older replica asks for
msgpack only and gets it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote

from tidemq.protocol import CONTENT_MSGPACK

CONTENT_CHUNK = "application/vnd.tidemq.log-chunk"
#: what a replica's fetch accepts: the chunk form, else (an older primary) msgpack
FETCH_ACCEPT = f"{CONTENT_CHUNK}, {CONTENT_MSGPACK};q=0.5"
PREFIX = "x-tidemq-fetch-"
#: answer field → header; ``data`` is the body
INT_FIELDS = ("epoch", "hwm", "log_end", "min_offset", "segment_bytes")


def wants_chunk(accept: str | None) -> bool:
    """Whether a fetch asked for the chunk form (a replica of this version or later)."""
    return bool(accept) and CONTENT_CHUNK in accept  # type: ignore[operator]


def is_chunk(content_type: str | None) -> bool:
    return bool(content_type) and content_type.startswith(CONTENT_CHUNK)  # type: ignore[union-attr]


def chunk_headers(epoch: int, hwm: int, log_end: int, min_offset: int, segment_bytes: int,
                  meta_version: str, epochs: list[list[int]], floors: Mapping[str, int]
                  ) -> dict[str, str]:
    """The headers of a chunk answer (every field of the msgpack answer but ``data``)."""
    return {
        PREFIX + "epoch": str(epoch), PREFIX + "hwm": str(hwm),
        PREFIX + "log-end": str(log_end), PREFIX + "min-offset": str(min_offset),
        PREFIX + "segment-bytes": str(segment_bytes),
        PREFIX + "meta-version": quote(meta_version, safe=""),
        PREFIX + "epochs": ",".join(f"{e}:{s}" for e, s in epochs),
        PREFIX + "floors": ",".join(f"{quote(o, safe='')}={off}" for o, off in floors.items()),
    }


def parse_chunk(headers: Mapping[str, str], body: bytes) -> dict[str, Any]:
    """A chunk answer as the msgpack answer's map (``data``, ``epoch``, ``epochs``, ...);
    ValueError when a header is missing or malformed."""
    try:
        out: dict[str, Any] = {f: int(headers[PREFIX + f.replace("_", "-")])
                               for f in INT_FIELDS}
        out["meta_version"] = unquote(headers[PREFIX + "meta-version"])
        epochs = headers[PREFIX + "epochs"]
        out["epochs"] = [[int(e), int(s)] for e, _, s in
                         (item.partition(":") for item in epochs.split(","))] if epochs else []
        floors = headers.get(PREFIX + "floors", "")
        out["floors"] = {unquote(o): int(off) for o, _, off in
                         (item.rpartition("=") for item in floors.split(","))} if floors else {}
    except KeyError as exc:
        raise ValueError(f"a chunk fetch answer without the header {exc}") from None
    out["data"] = body
    return out
