"""Fixtures of the replication tests: a real etcd-server per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.etcd import EtcdServer


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path_factory.mktemp("etcd")).start()
    yield server
    server.stop()
