"""Which record core runs: the compiled twin (``_crecords``, Cython, built by ``pip install``
when a C compiler is there) or the pure-Python modules (the reference, always present).

The broker's store has twins of its own (``tidemq_server.broker.store._cstore``: index entries,
consume-queue units, commit copies written from stored halves), loaded by ``load_twin`` under
the same switch.

``TIDEMQ_PURE_PYTHON=1`` (any value but "" and "0") keeps the pure modules even when the
extension is built: the suite runs once that way too (``make test-pure``). ``COMPILED`` says
which one this process runs; the benches' JSON and the broker's ``/metrics``
(``tidemq_record_core_compiled``) report it.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

PURE_ENV = "TIDEMQ_PURE_PYTHON"  # set (not "" or "0"): the pure-Python record core only


def load_twin(name: str) -> ModuleType | None:
    """The compiled module ``name`` (a pure module's twin), or None when it is not built or
    the environment asks for pure Python."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return None
    try:
        return importlib.import_module(name)
    except ImportError:  # not built (no compiler at install time): the pure modules run
        return None


core: ModuleType | None = load_twin("tidemq.protocol.records._crecords")
COMPILED = core is not None  # the compiled twin replaces the hot functions
