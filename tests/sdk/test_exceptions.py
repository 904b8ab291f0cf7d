from __future__ import annotations

import tidemq
from tidemq import _exceptions
from tidemq._exceptions import ServerError, error_class, server_error
from tidemq.protocol import ErrorCode


def test_every_code_has_its_own_class_with_the_protocol_retriable_flag() -> None:
    classes = set()
    for code in ErrorCode:
        cls = error_class(code)
        assert cls is not ServerError, code
        assert cls.error_code is code
        assert cls.retriable is code.retriable
        classes.add(cls)
    assert len(classes) == len(ErrorCode)


def test_every_class_is_exported_and_drawn_in_the_tree() -> None:
    doc = _exceptions.__doc__ or ""
    for name in dir(_exceptions):
        obj = getattr(_exceptions, name)
        if isinstance(obj, type) and issubclass(obj, tidemq.TidemqError):
            assert name in doc, name
            assert name in tidemq.__all__, name


def test_server_error_carries_code_message_status_retry_after() -> None:
    exc = server_error("BROKER_BUSY", "slow down", 503, 1.5)
    assert isinstance(exc, tidemq.BrokerBusyError)
    assert exc.code is ErrorCode.BROKER_BUSY
    assert (exc.message, exc.status, exc.retry_after, exc.retriable) == ("slow down", 503, 1.5,
                                                                         True)
    assert "BROKER_BUSY" in str(exc) and "slow down" in str(exc)


def test_default_status_and_retriable_flags() -> None:
    assert server_error(ErrorCode.TOPIC_NOT_FOUND, "x").status == 404
    assert server_error(ErrorCode.DISK_FULL, "x").retriable  # space may come back
    assert not server_error(ErrorCode.FORBIDDEN, "x").retriable
    assert tidemq.TransportError("x").retriable
    assert tidemq.RequestTimeoutError("x").retriable
    assert not tidemq.ConfigurationError("x").retriable
    assert isinstance(tidemq.ConfigurationError("x"), ValueError)


def test_unknown_code_is_a_plain_server_error_retriable_by_status() -> None:
    busy = server_error("SOMETHING_NEW", "x", 503)
    assert type(busy) is ServerError and busy.retriable and busy.code == "SOMETHING_NEW"
    bad = server_error("SOMETHING_NEW", "x", 400)
    assert type(bad) is ServerError and not bad.retriable
    assert error_class("NOPE") is ServerError
