"""Accounts and ACL (docs/operations.md "Accounts and ACL", docs/api.md "Authentication").

- ``policy``: the ACL file's model (users, rules, default) and its parser;
- ``store``: the file, reloaded when it changes (a bad file keeps the last good policy);
- ``gate``: signature checks for both doors and the rules' decision, logged and counted;
- ``rest_rules`` / ``rest``: what each REST endpoint needs, and the middleware enforcing it;
- ``client``: how a service signs its own requests to the others (its service account).
"""

from __future__ import annotations

from typing import Protocol

from prometheus_client import CollectorRegistry

from tidemq_server.common.auth.client import use_account
from tidemq_server.common.auth.gate import Gate, Need, Refused
from tidemq_server.common.auth.policy import Policy, PolicyError, Resource, User
from tidemq_server.common.auth.store import AclStore

__all__ = ["AclStore", "Gate", "Need", "Policy", "PolicyError", "Refused", "Resource", "User",
           "acl_gate", "service_gate", "use_account"]


def acl_gate(acl_file: str, registry: CollectorRegistry | None) -> Gate | None:
    """The gate of a service whose ``acl_file`` setting is set; None (ACL off) when it is "".
    A file that does not load fails here, at start, with the reason."""
    if not acl_file:
        return None
    return Gate(AclStore(acl_file), registry)


class _AccountSettings(Protocol):
    acl_file: str
    access_key: str
    secret_key: str


def service_gate(settings: _AccountSettings, registry: CollectorRegistry | None) -> Gate | None:
    """A service's start: its own account signs its internal clients (when it has one), and
    its gate checks the requests it serves (when ``acl_file`` is set)."""
    use_account(settings.access_key, settings.secret_key)
    return acl_gate(settings.acl_file, registry)
