"""scripts/compose_preflight.py, loaded as a module (scripts/ is not a package)."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from tests.support.procs import REPO

NAME = "compose_preflight"


def preflight() -> ModuleType:
    if NAME not in sys.modules:
        spec = importlib.util.spec_from_file_location(NAME, REPO / "scripts" / f"{NAME}.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[NAME] = module  # dataclasses look their module up while it loads
        spec.loader.exec_module(module)
    return sys.modules[NAME]
