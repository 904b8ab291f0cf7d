"""tidemq services: nameserver, broker, checker, scheduler, metrics sidecar, and the CLI.

Imported as ``tidemq_server`` (the folder ``services/`` is mapped to that name when installed:
``pip install 'tidemq[server]'``). The version is the SDK's: one distribution carries both.
"""

from __future__ import annotations

from tidemq import __version__

__all__ = ["__version__"]
