"""Shared fixtures: a real redis-server per test session, temp dirs, free ports."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.clock import FakeClock
from tests.support.postgres import PostgresServer
from tests.support.procs import RedisServer

# pytest imports readline at start (``_pytest.capture._readline_workaround``), and GNU readline
# exports its screen size, LINES=24 and COLUMNS=80 without a terminal, to the process's C
# environment: os.environ does not show them, but every child inherits them, so pytest-xdist
# workers start with COLUMNS=80 in os.environ. The CLI's rich consoles are built when
# tidemq_server.cli is imported and keep the COLUMNS of that moment for good, so a test's
# ``CliRunner.invoke(..., env={"COLUMNS": "200"})`` was ignored in a worker and wide tables
# were cut at 80 columns. Drop both before any test module imports the CLI; a test that wants
# a width sets it itself.
for _size in ("COLUMNS", "LINES"):
    os.environ.pop(_size, None)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A real PostgreSQL for the session (tests/support/postgres.py); ``database()`` gives each
    test an empty database of its own."""
    server = PostgresServer().start()
    yield server
    server.stop()


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    path = tmp_path / "store"
    path.mkdir()
    return path


@pytest.fixture
def clock() -> FakeClock:
    """A clock the test moves by hand (tests/support/clock.py)."""
    return FakeClock()
