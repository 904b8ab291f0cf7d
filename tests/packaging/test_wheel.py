"""The wheel built from a checkout: both import packages under their names, the compiled record
core where a compiler is (and a warning, not a failure, where none is), and what installing it
without an extra brings. Two builds (seconds each) and one install of the SDK alone with its
few requirements into a throwaway venv (about half a minute)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.procs import REPO

pytestmark = pytest.mark.integration

PIP_TIMEOUT_S = 300.0  # a build or a resolution on a loaded machine
SOURCES = ("pyproject.toml", "setup.py", "README.md", "sdk/tidemq", "services")
# installed with the SDK alone: never the services' web stack or Spark
SERVER_ONLY = {"fastapi", "uvicorn", "redis", "typer", "grpcio", "pyspark", "pandas", "pyarrow"}


# the compiled record core can be built here: Cython (the dev extra) and a C compiler
CAN_COMPILE = importlib.util.find_spec("Cython") is not None and shutil.which("gcc") is not None
CORE = re.compile(r"tidemq/protocol/records/_crecords\..*\.so")


def pip(*args: str, cwd: Path,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S,
                          env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def build_wheel(src: Path, dist: Path, *pip_args: str,
                env: dict[str, str] | None = None) -> tuple[Path, str]:
    """A wheel built from a copy of the checkout's sources (nothing written into the tree; a
    record core built in place there is left out) and pip's output."""
    src.mkdir(exist_ok=True)
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns(
                "__pycache__", "*.pyc", "*.so", "_crecords.c"))
        else:
            shutil.copy2(REPO / name, src / name)
    done = pip("wheel", "--no-deps", "--no-build-isolation", *pip_args, "-w", str(dist),
               str(src), cwd=src, env=env)
    [built] = dist.glob("tidemq-*.whl")
    return built, done.stdout + done.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built, _ = build_wheel(tmp_path_factory.mktemp("checkout"), tmp_path_factory.mktemp("dist"),
                           "-q")
    return built


def test_the_wheel_holds_both_packages_under_their_import_names(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    server = {f"tidemq_server/{p.relative_to(REPO / 'services').as_posix()}"
              for p in (REPO / "services").rglob("*.py") if "__pycache__" not in p.parts}
    sdk = {f"tidemq/{p.relative_to(REPO / 'sdk/tidemq').as_posix()}"
           for p in (REPO / "sdk/tidemq").rglob("*.py") if "__pycache__" not in p.parts}
    assert server <= names, sorted(server - names)
    assert sdk <= names, sorted(sdk - names)
    assert {"tidemq/py.typed", "tidemq_server/console/templates/base.html",
            "tidemq_server/console/static/console.css"} <= names
    assert not any(n.startswith("services/") for n in names)


@pytest.mark.skipif(not CAN_COMPILE, reason="no Cython or no gcc: nothing to compile with")
def test_the_wheel_carries_the_compiled_record_core(wheel: Path) -> None:
    assert any(CORE.fullmatch(n) for n in zipfile.ZipFile(wheel).namelist())


def test_without_a_compiler_the_install_warns_and_keeps_pure_python(tmp_path: Path) -> None:
    """A machine without gcc (CC names a compiler that fails): the build still succeeds, says
    why the record core is not compiled, and the wheel holds the pure modules only."""
    env = {**os.environ, "CC": "false", "LDSHARED": "false"}
    built, said = build_wheel(tmp_path / "src", tmp_path / "dist", "-v", env=env)
    assert "compiled record core is not built" in said
    names = zipfile.ZipFile(built).namelist()
    assert not any(CORE.fullmatch(n) for n in names)
    assert {"tidemq/protocol/records/v2.py", "tidemq/protocol/records/v2_read.py"} <= set(names)


def test_the_sdk_alone_installs_without_the_server_requirements(wheel: Path,
                                                                tmp_path: Path) -> None:
    """``pip install tidemq`` (the wheel, no extra) into a throwaway venv, with its requirements:
    none of the services' is installed, the extras declare them, and the console script names
    the extra to install."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=PIP_TIMEOUT_S)
    python = venv / "bin" / "python"
    pip("--python", str(python), "install", "-q", str(wheel), cwd=tmp_path)
    code = ("import importlib.metadata as m, json\n"
            "from tidemq.protocol.records._compiled import COMPILED\n"
            "print(json.dumps([m.version('tidemq'), m.requires('tidemq'),\n"
            "                  [d.metadata['Name'].lower() for d in m.distributions()],\n"
            "                  COMPILED]))")
    shown = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                           check=True, timeout=PIP_TIMEOUT_S)
    version, requires, installed, compiled = json.loads(shown.stdout)
    # the installed SDK runs the record core the wheel carries
    assert compiled == any(CORE.fullmatch(n) for n in zipfile.ZipFile(wheel).namelist())
    assert not set(installed) & SERVER_ONLY, sorted(set(installed) & SERVER_ONLY)
    assert {"tidemq", "httpx", "msgpack", "orjson", "sniffio"} <= set(installed)
    assert version == (REPO / "sdk/tidemq/__init__.py").read_text().split(
        '__version__ = "')[1].split('"')[0]

    def names(extra: str | None) -> set[str]:
        marker = f'extra == "{extra}"' if extra else "extra =="
        picked = [r for r in requires if (marker in r) == (extra is not None)]
        return {re.split(r"[\s;\[<>=!~]", r, maxsplit=1)[0] for r in picked}

    assert names(None) == {"httpx", "msgpack", "orjson", "sniffio"}
    assert {"fastapi", "uvicorn", "redis", "typer"} <= names("server")
    assert "pyspark" not in names("server")
    assert {"tidemq", "pyspark", "pandas"} <= names("metrics")
    # the console script without the server extra: one line naming it, not a traceback
    script = subprocess.run([str(venv / "bin" / "tidemq"), "--help"], capture_output=True,
                            text=True, timeout=PIP_TIMEOUT_S)
    assert script.returncode == 1
    assert "pip install 'tidemq[server]'" in script.stderr
    assert "Traceback" not in script.stderr
