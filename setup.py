"""The package list, which pyproject.toml cannot compute under a mapped name.

pyproject.toml maps the import name ``tidemq_server`` to the folder ``services/`` (package-dir);
setuptools then needs every subpackage under its import name, so they are found here from the
folders (a package added under services/ is packaged without editing a list). Everything else
is in pyproject.toml.
"""

from __future__ import annotations

from setuptools import find_packages, setup

SERVER_FOLDER = "services"  # imported as tidemq_server
SERVER_NAME = "tidemq_server"


def packages() -> list[str]:
    sdk = find_packages("sdk", include=["tidemq", "tidemq.*"])
    server = find_packages(".", include=[SERVER_FOLDER, f"{SERVER_FOLDER}.*"])
    return sdk + [SERVER_NAME + name.removeprefix(SERVER_FOLDER) for name in server]


setup(packages=packages())
