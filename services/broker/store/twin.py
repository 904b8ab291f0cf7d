"""The store's compiled twin, loaded once: ``cstore`` is ``_cstore`` (``_cstore.pyx``: index
entries, consume-queue units, commit copies), or None where it is not built or
``TIDEMQ_PURE_PYTHON`` asks for pure Python (``tidemq.protocol.records._compiled.load_twin``).
Each pure module binds its references into it and takes its functions, as the SDK's record
modules do with ``_compiled.core``."""

from __future__ import annotations

from types import ModuleType

from tidemq.protocol.records._compiled import load_twin

cstore: ModuleType | None = load_twin("tidemq_server.broker.store._cstore")
