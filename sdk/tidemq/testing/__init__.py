"""``tidemq.testing``: tidemq for your tests, in memory or as real processes.

**In memory** (``tidemq.testing.memory.TestBroker``; only the SDK needed): a broker and
nameserver answering the REST API from memory with a clock the test moves, so an application's
unit tests run in milliseconds. The fixture ``tidemq_test_broker`` gives each test a fresh one::

    async def test_order_is_published(tidemq_test_broker):
        topic = tidemq_test_broker.create_topic("Orders")
        async with tidemq_test_broker.producer() as producer:
            sent = await producer.send(b"order 42", topic=topic, delay_ms=60_000)
        tidemq_test_broker.advance(60)  # a minute passes at once
        got = await tidemq_test_broker.wait_for_message(topic, message_id=sent.message_id)
        assert got.body == b"order 42"

Importing this package imports neither pytest (when it is not installed) nor the part that
starts processes (until it is used).

**Real processes** (integration tests): installed with the SDK (entry point ``pytest11``), this
plugin gives every test session the fixture ``tidemq_system``: a redis-server, nameserver,
broker, checker and scheduler started once per session (per pytest-xdist worker) on free ports
in a temporary directory, and stopped at the end::

    async def test_order_is_published(tidemq_system):
        topic = await tidemq_system.create_topic()
        async with tidemq_system.producer() as producer:
            sent = await producer.send(b"order 42", topic=topic)
        got = await tidemq_system.wait_for_message(topic, message_id=sent.message_id)
        assert got.body == b"order 42"

Helpers (``TidemqSystem``): ``create_topic``, ``producer`` / ``transaction_producer`` /
``consumer`` (clients of this system with test-friendly intervals), ``wait_for_message``,
``check_now`` (a check-back scan at once: half messages sent with ``check_immunity_s=0`` are
checked by it), ``advance_clock`` (a delayed message days away is due now) and short delay
levels (``TEST_DELAY_LEVELS``). Async tests need an asyncio plugin such as pytest-asyncio.

``advance_clock`` lasts for the whole session: the system is shared by every test and the
scheduler's clock never moves back, so a later test's 30-minute timer may already be due. A
test that advances the clock, or asserts that a delay is not cut short, should use a
``TidemqSystem`` of its own (a function-scoped fixture).

The fixture needs the services installed, not only the SDK: the server extra
(``pip install 'tidemq[server]'``) and Debian's ``redis-server``. ``TidemqSystem`` can also be
used on its own, e.g. in a fixture of another scope or with other settings.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from tidemq.testing.memory import TestBroker

if TYPE_CHECKING:
    from tidemq.testing._system import TidemqSystem

__all__ = ["CHECK_INTERVAL_MS", "MAX_RECONSUME_TIMES", "TEST_DELAY_LEVELS",
           "TRANSACTION_TIMEOUT_MS", "TestBroker", "TidemqSystem"]

_FROM_SYSTEM = frozenset({"CHECK_INTERVAL_MS", "MAX_RECONSUME_TIMES", "TEST_DELAY_LEVELS",
                          "TRANSACTION_TIMEOUT_MS", "TidemqSystem"})


def __getattr__(name: str) -> Any:
    """The real-process helpers, imported on first use."""
    if name in _FROM_SYSTEM:
        return getattr(importlib.import_module("tidemq.testing._system"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if importlib.util.find_spec("pytest") is not None:
    import pytest

    @pytest.fixture(scope="session")
    def tidemq_system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TidemqSystem]:
        """A running tidemq (nameserver, broker, checker, scheduler, redis-server) for the
        session; each test should use its own topics and groups."""
        from tidemq.testing._system import TidemqSystem

        with TidemqSystem(tmp_path_factory.mktemp("tidemq")) as system:
            yield system

    @pytest.fixture
    def tidemq_test_broker() -> Iterator[TestBroker]:
        """A fresh in-memory ``TestBroker`` for one test (no processes, a manual clock)."""
        broker = TestBroker()
        yield broker
        broker.close()
