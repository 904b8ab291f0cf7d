"""Accounts for ``bench.security``: how the ACL configurations turn accounts on.

``acl_setup`` answers None while the broker has no ACL setting (then the ACL rows of the bench
are "not measured"); else the broker's environment naming an ACL file written here and the
client environment (``TIDEMQ_ACCESS_KEY`` / ``TIDEMQ_SECRET_KEY``) under which the SDK signs
every request. The file is shaped like a real one: default deny, a few accounts, and the bench's
account allowed by prefix rules (publish to and administer ``Sec*`` topics), so each request is
signed, verified and matched against rules as in production.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import yaml

TOPIC_PREFIX = "Sec"  # every bench topic starts with this (the account's rules cover them)


@dataclass(frozen=True, slots=True)
class AclSetup:
    broker_env: dict[str, str]  # turns accounts on at the broker
    client_env: dict[str, str]  # makes the SDK sign as the bench's account


def acl_setup(workdir: Path) -> AclSetup | None:
    """None: this broker has no ACL setting (``acl_file``) to measure."""
    from tidemq_server.broker.settings import BrokerSettings

    if "acl_file" not in BrokerSettings.model_fields:
        return None
    from tidemq_server.common.auth.policy import user_entry

    ak, sk = f"bench-{secrets.token_hex(4)}", secrets.token_urlsafe(32)
    users = [user_entry(f"app-{i}", f"app-{i}-{secrets.token_hex(4)}",
                        secrets.token_urlsafe(32), [(f"topic:orders-{i}-*", ["pub", "sub"])])
             for i in range(8)]
    users.append(user_entry("bench", ak, sk, [(f"topic:{TOPIC_PREFIX}*", ["pub", "admin"])]))
    path = workdir / "acl.yaml"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        yaml.safe_dump({"default": "deny", "users": users}, f, sort_keys=False)
    return AclSetup(broker_env={"TIDEMQ_BROKER_ACL_FILE": str(path)},
                    client_env={"TIDEMQ_ACCESS_KEY": ak, "TIDEMQ_SECRET_KEY": sk})
