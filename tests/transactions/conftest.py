"""Fixtures of the transaction tests: one broker + checker shared by a module, on the session's
redis-server (short check interval and immunity, see cluster.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.procs import RedisServer
from tests.transactions.cluster import BrokerHandle, CheckerHandle, run_broker, run_checker


@dataclass
class Cluster:
    broker: BrokerHandle
    checker: CheckerHandle
    workdir: Path
    redis_url: str


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory,
            redis_server: RedisServer) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("tx")
    with run_broker(workdir, redis_server.url, producer_expiry_s=30) as broker, \
            run_checker(workdir, broker, redis_server.url) as checker:
        yield Cluster(broker, checker, workdir, redis_server.url)
