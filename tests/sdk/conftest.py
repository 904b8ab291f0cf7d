"""Fixtures for SDK unit tests: an in-memory cluster behind httpx.MockTransport."""

from __future__ import annotations

import pytest

from tests.sdk.fakes import FakeCluster


@pytest.fixture
def cluster() -> FakeCluster:
    c = FakeCluster(brokers=1, nameservers=1)
    c.create_topic("orders", 4)
    return c


@pytest.fixture
def two_brokers() -> FakeCluster:
    c = FakeCluster(brokers=2, nameservers=2)
    c.create_topic("orders", 4)
    return c
