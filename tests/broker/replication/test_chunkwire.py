"""The fetch answer's chunk form (raw bytes, fields in headers) against its msgpack form."""

from __future__ import annotations

import pytest
from tidemq.protocol.codec import is_msgpack

from tidemq_server.broker.replication.chunkwire import (
    FETCH_ACCEPT,
    chunk_headers,
    is_chunk,
    parse_chunk,
    wants_chunk,
)


def test_the_headers_carry_every_field_of_the_msgpack_answer() -> None:
    floors = {"scheduler": 4096, "odd owner,=:%/é": 7}
    headers = chunk_headers(3, 900, 1000, 0, 1 << 20, "0a1b2c3d-4 x,y", [[1, 0], [3, 512]],
                            floors)
    assert all(v.isascii() for v in headers.values())  # every header value is plain ASCII
    assert parse_chunk(headers, b"raw") == {
        "data": b"raw", "epoch": 3, "hwm": 900, "log_end": 1000, "min_offset": 0,
        "segment_bytes": 1 << 20, "meta_version": "0a1b2c3d-4 x,y",
        "epochs": [[1, 0], [3, 512]], "floors": floors}
    empty = chunk_headers(0, -1, 0, 0, 4096, "", [], {})
    assert parse_chunk(empty, b"") == {
        "data": b"", "epoch": 0, "hwm": -1, "log_end": 0, "min_offset": 0,
        "segment_bytes": 4096, "meta_version": "", "epochs": [], "floors": {}}


def test_a_missing_header_is_an_error_not_a_default() -> None:
    headers = chunk_headers(1, 0, 0, 0, 4096, "v", [[1, 0]], {})
    del headers["x-tidemq-fetch-hwm"]
    with pytest.raises(ValueError, match="x-tidemq-fetch-hwm"):
        parse_chunk(headers, b"")


def test_an_older_primary_answers_msgpack_to_a_newer_replica() -> None:
    # an older primary only looks for "msgpack" in accept (common/app.py reply)
    assert is_msgpack(FETCH_ACCEPT) and wants_chunk(FETCH_ACCEPT)
    assert not wants_chunk("application/msgpack")  # an older replica gets msgpack
    assert is_chunk("application/vnd.tidemq.log-chunk") and not is_chunk("application/msgpack")
