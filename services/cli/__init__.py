"""The `tidemq` command line: start a local cluster, administer topics, send, consume, query.

Talks to the services over their REST API with plain httpx (no SDK dependency).
"""

from __future__ import annotations

import sys

import typer

from tidemq_server.cli.errors import EXIT_FAILURE, EXIT_USAGE, FAILED, USAGE, print_json_error
from tidemq_server.cli.root import app


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``tidemq = "tidemq_server.cli:main"``).

    With ``--json`` anywhere before ``--``, a usage error (unknown option, missing argument)
    is one JSON object on stderr too, like every other error."""
    args = sys.argv[1:] if argv is None else argv
    options = args[:args.index("--")] if "--" in args else args
    if "--json" not in options:
        app(args=args, prog_name="tidemq")
        return
    command = typer.main.get_command(app)
    try:
        status = command.main(args=args, prog_name="tidemq", standalone_mode=False)
    except typer.TyperException as exc:  # click's usage errors (typer vendors click)
        code = USAGE if exc.exit_code == EXIT_USAGE else FAILED
        print_json_error(code, exc.format_message())
        sys.exit(exc.exit_code)
    except typer.Abort:
        print_json_error("ABORTED", "aborted")
        sys.exit(EXIT_FAILURE)
    sys.exit(status if isinstance(status, int) else 0)


__all__ = ["app", "main"]
