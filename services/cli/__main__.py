"""``python -m services.cli``: the same as the ``tidemq`` command."""

from __future__ import annotations

from services.cli import main

if __name__ == "__main__":
    main()
