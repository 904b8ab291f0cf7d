"""Fixtures of the metrics tests: one Spark session for the whole run, and a real broker."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.broker import TOKEN, BrokerHandle, run_broker
from tests.support.procs import RedisServer


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """Real Spark in local mode, shared by every test (a session costs ~7 s to start)."""
    if shutil.which("java") is None:
        pytest.fail("java is not installed: run scripts/install-system-deps.sh")
    from tidemq_server.metrics.job import SessionConfig, build_session

    session = build_session(SessionConfig(master="local[2]", app_name="tidemq-metrics-tests",
                                          shuffle_partitions=2, ui=False))
    yield session
    session.stop()


@pytest.fixture(scope="session")
def events_broker(tmp_path_factory: pytest.TempPathFactory,
                  redis_server: RedisServer) -> Iterator[BrokerHandle]:
    with run_broker(tmp_path_factory.mktemp("metrics-broker"), redis_server.url) as handle:
        yield handle


@pytest.fixture
def token() -> str:
    return TOKEN


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    return tmp_path / "job"
