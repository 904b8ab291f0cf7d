"""The outcome table: a store write's refusal becomes the client's error code and text."""

from __future__ import annotations

import pytest
from tidemq.protocol import ErrorCode, ProtocolError

from tidemq_server.broker.ingest.outcome import (
    PUT_ERRORS,
    appended_or_raise,
    settled_or_raise,
    write_failed,
)
from tidemq_server.broker.store.types import Appended, PutResult, PutStatus


@pytest.mark.parametrize(("status", "code"), [
    (PutStatus.BUSY, ErrorCode.BROKER_BUSY), (PutStatus.DISK_FULL, ErrorCode.DISK_FULL),
    (PutStatus.UNAVAILABLE, ErrorCode.UNAVAILABLE),
    (PutStatus.TOO_LARGE, ErrorCode.MESSAGE_TOO_LARGE)])
def test_put_status_maps_to_error_code(status: PutStatus, code: ErrorCode) -> None:
    with pytest.raises(ProtocolError) as err:
        appended_or_raise(PutResult(status, message="why"))
    assert err.value.code is code and "why" in err.value.message
    assert appended_or_raise(PutResult(PutStatus.OK, [])) == []


def test_every_refusal_has_an_error_and_ok_has_none() -> None:
    assert set(PUT_ERRORS) == set(PutStatus) - {PutStatus.OK}
    where = [Appended(0, 1, 2, 3, 4)]
    assert appended_or_raise(PutResult(PutStatus.OK, where)) is where


def test_settle_raises_the_refusal_of_its_status() -> None:
    settled_or_raise(PutStatus.OK)
    with pytest.raises(ProtocolError) as err:
        settled_or_raise(PutStatus.NOT_ENOUGH_REPLICAS)
    assert err.value.code is ErrorCode.NOT_ENOUGH_REPLICAS


def test_a_failed_write_hands_waiters_a_protocol_error() -> None:
    mine = ProtocolError(ErrorCode.DISK_FULL, "full")
    assert write_failed(mine) is mine
    other = write_failed(OSError("gone"))
    assert other.code is ErrorCode.UNAVAILABLE and "OSError" in other.message
