"""Which record core runs: the compiled twin (``_crecords``, Cython, built by ``pip install``
when a C compiler is there) or the pure-Python modules (the reference, always present).

``TIDEMQ_PURE_PYTHON=1`` (any value but "" and "0") keeps the pure modules even when the
extension is built: the suite runs once that way too (``make test-pure``). ``COMPILED`` says
which one this process runs; the benches' JSON and the broker's ``/metrics``
(``tidemq_record_core_compiled``) report it.
"""

from __future__ import annotations

import os
from types import ModuleType

PURE_ENV = "TIDEMQ_PURE_PYTHON"  # set (not "" or "0"): the pure-Python record core only


def _load() -> ModuleType | None:
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return None
    try:
        from tidemq.protocol.records import _crecords
    except ImportError:  # not built (no compiler at install time): the pure modules run
        return None
    return _crecords


core: ModuleType | None = _load()
COMPILED = core is not None  # the compiled twin replaces the hot functions
