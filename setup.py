"""The package list, which pyproject.toml cannot compute under a mapped name, and the optional
compiled record core.

pyproject.toml maps the import name ``tidemq_server`` to the folder ``services/`` (package-dir);
setuptools then needs every subpackage under its import name, so they are found here from the
folders (a package added under services/ is packaged without editing a list).

The compiled record core (``tidemq.protocol.records._crecords``, and the broker's index twin
``tidemq_server.broker.store._cstore``; Cython, linked to zlib) is built when Cython and a C
compiler are there (pyproject.toml's build requirements bring Cython; Debian's gcc,
python3-dev and zlib1g-dev the rest). Without them the install still succeeds, with a warning,
and the pure-Python modules run (they are the reference anyway).
``TIDEMQ_PURE_PYTHON=1`` at install time skips the build. Everything else is in pyproject.toml.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

SERVER_FOLDER = "services"  # imported as tidemq_server
SERVER_NAME = "tidemq_server"
PURE_ENV = "TIDEMQ_PURE_PYTHON"  # as tidemq/protocol/records/_compiled.py reads it
# the compiled twins: the SDK's record core, and the broker store's index entries
TWINS = [
    Extension("tidemq.protocol.records._crecords", ["sdk/tidemq/protocol/records/_crecords.pyx"],
              libraries=["z"], extra_compile_args=["-O2"]),
    Extension("tidemq_server.broker.store._cstore", ["services/broker/store/_cstore.pyx"],
              libraries=["z"], extra_compile_args=["-O2"]),
]


def packages() -> list[str]:
    sdk = find_packages("sdk", include=["tidemq", "tidemq.*"])
    server = find_packages(".", include=[SERVER_FOLDER, f"{SERVER_FOLDER}.*"])
    return sdk + [SERVER_NAME + name.removeprefix(SERVER_FOLDER) for name in server]


def warn(why: str) -> None:
    print(f"WARNING: tidemq's compiled record core is not built ({why}); the pure-Python "
          "record modules run instead (slower, same results)", file=sys.stderr)


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing: the extension is a speed-up, not a need."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler, no headers: distutils' errors vary
            warn(f"{type(exc).__name__}: {exc}")

    def build_extension(self, ext: Any) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            warn(f"{type(exc).__name__}: {exc}")


def ext_modules() -> list[Extension]:
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        warn("Cython is not installed")
        return []
    try:
        # sdk/ on the include path: both twins cimport tidemq/protocol/records/_bytes.pxd
        return list(cythonize(TWINS, language_level=3, quiet=True, include_path=["sdk"]))
    except Exception as exc:  # a Cython too old (or too new) for the source
        warn(f"cythonize: {type(exc).__name__}: {exc}")
        return []


setup(packages=packages(), ext_modules=ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
