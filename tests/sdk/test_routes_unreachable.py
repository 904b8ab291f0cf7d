"""No nameserver listening: one clear TransportError naming the addresses tried, with a hint,
and no warning per failed attempt. Real sockets on loopback (connections refused)."""

from __future__ import annotations

import logging

import pytest
from tidemq import Producer, RetryPolicy, TransportError

from tests.support.procs import free_port

FAST = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02)


async def test_unreachable_nameservers_give_one_clear_error(
        caplog: pytest.LogCaptureFixture) -> None:
    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    caplog.set_level(logging.DEBUG, logger="tidemq")
    async with Producer(nameservers=dead, retry=FAST) as producer:
        with pytest.raises(TransportError) as failed:
            await producer.send(b"x", topic="orders")

    text = str(failed.value)
    for address in dead:
        assert f"http://{address}" in text
    assert "topic 'orders'" in text and "3 time(s) each" in text
    assert "ConnectError" in text and text.count("ConnectError") == 1
    assert "Is the nameserver running?" in text and "`make up` starts one" in text
    assert failed.value.retriable
    assert isinstance(failed.value.__cause__, TransportError)  # the last attempt's own error
    # every attempt is at debug level only: the error itself is the one thing a user sees
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert len([r for r in caplog.records if "route lookup" in r.getMessage()]) == 6
