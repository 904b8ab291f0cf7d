"""The `tidemq` command line: start a local cluster, administer topics, send, consume, query.

Talks to the services over their REST API with plain httpx (no SDK dependency).
"""

from __future__ import annotations

from services.cli.root import app


def main() -> None:
    """Console-script entry point (``tidemq = "services.cli:main"``)."""
    app(prog_name="tidemq")


__all__ = ["app", "main"]
