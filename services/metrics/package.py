"""Build the zip that ``spark-submit --py-files`` ships to a Spark cluster.

    python -m tidemq_server.metrics.package dist/tidemq-metrics.zip

It holds what the job's driver and its Python workers import, under their import names:
``tidemq_server/metrics`` (the job, the data source and its helpers, from the folder
``services/metrics``), the ``tidemq_server/common`` modules they use (``COMMON``) and the SDK
package ``tidemq`` (system topic names, the wire protocol). Third-party modules (pyarrow, httpx,
msgpack, orjson) must be installed on every worker, as for any PySpark job.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import tidemq

SERVICES = Path(__file__).resolve().parents[1]  # the folder services/ (or an installed copy)
SERVER = "tidemq_server"  # its import name, the folder's name in the zip
SDK = Path(tidemq.__file__).resolve().parent  # .../tidemq
SKIP_MODULES = {"__main__.py", "sidecar.py", "settings.py", "package.py"}  # the web sidecar
COMMON = ("__init__.py", "constants.py", "files.py", "broker_client.py", "logs.py",
          "discovery.py", "tls.py",  # of services/common; the clients sign with auth.client
          "auth/__init__.py", "auth/client.py", "auth/gate.py", "auth/policy.py",
          "auth/store.py")


def members() -> list[tuple[Path, str]]:
    """(file, name in the zip) pairs, sorted."""
    out = [(SERVICES / "__init__.py", f"{SERVER}/__init__.py")]
    out += [(SERVICES / "common" / name, f"{SERVER}/common/{name}") for name in COMMON]
    for path in sorted((SERVICES / "metrics").glob("*.py")):
        if path.name not in SKIP_MODULES:
            out.append((path, f"{SERVER}/metrics/{path.name}"))
    for path in sorted(SDK.rglob("*")):
        if path.is_file() and path.suffix in (".py", ".typed"):
            out.append((path, f"tidemq/{path.relative_to(SDK).as_posix()}"))
    return out


def build(target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, name in members():
            zf.write(path, name)
    return target


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tidemq_server.metrics.package OUTPUT.zip", file=sys.stderr)
        return 2
    target = build(Path(args[0]))
    print(f"wrote {target} ({len(members())} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
