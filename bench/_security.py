"""Accounts for ``bench.security``: how the ACL configurations turn accounts on.

``acl_setup`` answers None while the broker has no ACL setting (then the ACL rows of the bench
are "not measured"); else the broker's environment naming an ACL file written here, with one
account allowed everything, and the client environment (``TIDEMQ_ACCESS_KEY`` /
``TIDEMQ_SECRET_KEY``) under which the SDK signs every request as that account.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class AclSetup:
    broker_env: dict[str, str]  # turns accounts on at the broker
    client_env: dict[str, str]  # makes the SDK sign as an account allowed everything


def acl_setup(workdir: Path) -> AclSetup | None:
    """None: this broker has no ACL setting (``acl_file``) to measure."""
    from services.broker.settings import BrokerSettings

    if "acl_file" not in BrokerSettings.model_fields:
        return None
    raise NotImplementedError("the ACL file format is not known to this bench yet")
