"""The ``tidemq`` console script: the CLI, or which extra it needs when only the SDK is installed.

``pip install tidemq`` installs the script with the SDK alone (one distribution), whose
requirements do not include the CLI's (typer, rich, the services' libraries). Rather than a
traceback, the script names the extra to install.
"""

from __future__ import annotations

import sys

SERVER_EXTRA_HINT = "pip install 'tidemq[server]'"


def main() -> None:
    try:
        from tidemq_server.cli import main as cli_main
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] in ("tidemq", "tidemq_server"):
            raise  # a broken install, not a missing extra
        print(f"tidemq: the command needs the server extra ({exc.name} is missing): "
              f"{SERVER_EXTRA_HINT}", file=sys.stderr)
        raise SystemExit(1) from None
    cli_main()
