"""``python -m tidemq_server.cli``: the same as the ``tidemq`` command."""

from __future__ import annotations

from tidemq_server.cli import main

if __name__ == "__main__":
    main()
