"""``tidemq up --acl FILE``: accounts on for every service it starts.

The services read the operator's file and, next to it, ``<data-dir>/acl-services.yaml``: the
account the services themselves sign with (``tidemq-services``, every action on every resource:
internal endpoints, broker registration, what the console reads and does). That file is made
once with random keys (mode 0600) and kept across runs; the operator's file is never written.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import yaml

from tidemq_server.common.auth.policy import PolicyError, user_entry
from tidemq_server.common.auth.store import load_policy

SERVICES_FILE = "acl-services.yaml"  # under the data dir
SERVICE_ACCOUNT = "tidemq-services"


@dataclass(frozen=True)
class AclSetup:
    files: str  # comma-separated, as every service's …ACL_FILE
    access_key: str
    secret_key: str

    def env(self) -> dict[str, str]:
        """The settings (without prefix) every service gets."""
        return {"ACL_FILE": self.files, "ACCESS_KEY": self.access_key,
                "SECRET_KEY": self.secret_key}


def _services_account(data_dir: Path) -> tuple[Path, str, str]:
    path = data_dir.resolve() / SERVICES_FILE
    if path.exists():
        policy = load_policy(path)
        for user in policy.users.values():
            if user.name == SERVICE_ACCOUNT:
                return path, user.access_key, user.secret_key
        raise PolicyError(f"{path} has no {SERVICE_ACCOUNT} account: delete it to make a new one")
    ak, sk = f"tidemq-svc-{secrets.token_hex(6)}", secrets.token_urlsafe(32)
    doc = {"users": [user_entry(SERVICE_ACCOUNT, ak, sk, [("*", ["all"])])]}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("# made by `tidemq up --acl`: the services' own account (keep it secret)\n")
        yaml.safe_dump(doc, f, sort_keys=False)
    return path, ak, sk


def prepare_acl(acl_file: Path, data_dir: Path) -> AclSetup:
    """Check the operator's file and make (or reuse) the services' account; ``PolicyError``
    saying what is wrong."""
    acl_file = acl_file.resolve()
    services, ak, sk = _services_account(data_dir)
    load_policy([acl_file, services])  # both load together (no access key used twice)
    return AclSetup(f"{acl_file},{services}", ak, sk)
