"""The compose init step: TLS files and the accounts file, made once into one directory.

    python -m tidemq_server.cli.init_secrets --dir /secrets --name broker-a --name ... [--acl]

- TLS: a development CA and a server certificate for every ``--name`` (``tidemq_server.cli.certs``).
- ``--acl``: ``acl.yaml`` (mode 0600), the accounts every service loads (``…ACL_FILE``):
  ``tidemq-services``, the services' own account, with the access key and secret key of
  ``TIDEMQ_SERVICES_ACCESS_KEY`` / ``TIDEMQ_SERVICES_SECRET_KEY`` (the same variables give them
  to the services, as the cluster token is given), and ``admin``, an operator account with
  keys generated on the first run and kept in ``admin.env`` (mode 0600, as
  ``TIDEMQ_ACCESS_KEY=…`` / ``TIDEMQ_SECRET_KEY=…`` lines the SDK and CLI read). Both may do
  everything; anything else is denied: add your applications' accounts with narrower rules
  (docs/operations.md, "Accounts and ACL"). The file is rewritten on every run, so a changed
  services secret takes effect; the admin keys stay.

No secret is printed: the output names the files.
"""

from __future__ import annotations

import argparse
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tidemq_server.cli.certs import LOCAL_NAMES, ensure_dev_pki

ACL_FILE = "acl.yaml"
ADMIN_FILE = "admin.env"
SERVICES_ACCOUNT = "tidemq-services"
ADMIN_ACCOUNT = "admin"
SERVICES_KEY_ENV = "TIDEMQ_SERVICES_ACCESS_KEY"
SERVICES_SECRET_ENV = "TIDEMQ_SERVICES_SECRET_KEY"
MIN_SECRET_CHARS = 16  # a shorter services secret is refused


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def admin_keys(directory: Path) -> tuple[str, str]:
    """The admin account's keys: read from ``admin.env``, made (random) when it is absent."""
    path = directory / ADMIN_FILE
    try:
        pairs = dict(line.split("=", 1) for line in path.read_text().splitlines()
                     if "=" in line and not line.startswith("#"))
        return pairs["TIDEMQ_ACCESS_KEY"], pairs["TIDEMQ_SECRET_KEY"]
    except (FileNotFoundError, KeyError, ValueError):
        pass
    ak, sk = f"admin-{secrets.token_hex(6)}", secrets.token_urlsafe(32)
    _write_private(path, "# made by the compose init step: the operator's account "
                         f"(keep it secret)\nTIDEMQ_ACCESS_KEY={ak}\nTIDEMQ_SECRET_KEY={sk}\n")
    return ak, sk


def _user(name: str, access_key: str, secret_key: str) -> dict[str, Any]:
    return {"name": name, "access_key": access_key, "secret_key": secret_key,
            "rules": [{"resource": "*", "actions": ["all"]}]}


def ensure_acl(directory: Path, env: Mapping[str, str]) -> Path:
    """Write ``acl.yaml`` with the services' account (keys from ``env``) and the admin's."""
    ak, sk = env.get(SERVICES_KEY_ENV, ""), env.get(SERVICES_SECRET_ENV, "")
    if not ak or len(sk) < MIN_SECRET_CHARS:
        raise SystemExit(f"set {SERVICES_KEY_ENV} and {SERVICES_SECRET_ENV} (at least "
                         f"{MIN_SECRET_CHARS} characters): the services' own account")
    admin_ak, admin_sk = admin_keys(directory)
    if admin_ak == ak:
        raise SystemExit(f"{SERVICES_KEY_ENV} is the admin's access key: choose another")
    doc = {"default": "deny", "users": [_user(SERVICES_ACCOUNT, ak, sk),
                                        _user(ADMIN_ACCOUNT, admin_ak, admin_sk)]}
    path = directory / ACL_FILE
    _write_private(path, "# made by the compose init step (services/cli/init_secrets.py); "
                         "rewritten on every run\n" + yaml.safe_dump(doc, sort_keys=False))
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tidemq_server.cli.init_secrets",
                                     description="Make the TLS files and the accounts file.")
    parser.add_argument("--dir", type=Path, required=True, help="where the files go")
    parser.add_argument("--name", action="append", default=[],
                        help="a host name or IP the services are reached by (repeatable)")
    parser.add_argument("--acl", action="store_true",
                        help=f"also write {ACL_FILE} and {ADMIN_FILE} (accounts on)")
    args = parser.parse_args(argv)
    pki = ensure_dev_pki(args.dir, args.name)
    print(f"CA {pki.ca}; certificate {pki.cert} for "
          f"{', '.join([*LOCAL_NAMES, *args.name])}", flush=True)
    if args.acl:
        path = ensure_acl(args.dir, os.environ)
        print(f"accounts {path}; the admin's keys are in {args.dir / ADMIN_FILE}", flush=True)


if __name__ == "__main__":
    main()
