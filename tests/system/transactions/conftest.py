"""The ``cluster`` fixture (one broker + checker shared by a module, on the session's
redis-server) for the transaction tests here; see tests/support/transactions.py."""

from __future__ import annotations

from tests.support.transactions import cluster

__all__ = ["cluster"]
