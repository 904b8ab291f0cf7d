"""``tidemq.testing``: a pytest plugin that runs a real tidemq for your tests.

Installed with the SDK (entry point ``pytest11``), it gives every test session the fixture
``tidemq_system``: a redis-server, nameserver, broker, checker and scheduler started once per
session (per pytest-xdist worker) on free ports in a temporary directory, and stopped at the
end. Nothing to import or configure::

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

The fixture needs the services installed, not only the SDK: the ``tidemq-services`` package
and Debian's ``redis-server``. ``TidemqSystem`` can also be used on its own, e.g. in a fixture
of another scope or with other settings.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tidemq.testing._system import (
    CHECK_INTERVAL_MS,
    MAX_RECONSUME_TIMES,
    TEST_DELAY_LEVELS,
    TRANSACTION_TIMEOUT_MS,
    TidemqSystem,
)

__all__ = ["CHECK_INTERVAL_MS", "MAX_RECONSUME_TIMES", "TEST_DELAY_LEVELS",
           "TRANSACTION_TIMEOUT_MS", "TidemqSystem", "tidemq_system"]


@pytest.fixture(scope="session")
def tidemq_system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TidemqSystem]:
    """A running tidemq (nameserver, broker, checker, scheduler, redis-server) for the
    session; each test should use its own topics and groups."""
    with TidemqSystem(tmp_path_factory.mktemp("tidemq")) as system:
        yield system
