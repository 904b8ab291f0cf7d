"""Accounts and rules (the ACL file, docs/operations.md "Accounts and ACL"): who may do what.

The shape follows RocketMQ ACL 2.0 (users; per user, policies of resource + actions + decision,
deny winning over allow, prefix wildcards) with tidemq's resources and actions::

    default: deny                      # decision when no rule of the user matches
    users:
      - name: orders-app
        access_key: AK_ORDERS
        secret_key: "..."
        rules:
          - {resource: "topic:orders-*", actions: [pub, sub], decision: allow}
          - {resource: "group:billing", actions: [sub]}          # decision: allow by default
          - {resource: "topic:orders-audit", actions: [all], decision: deny}

Resources: ``topic:NAME``, ``group:NAME`` (consumer group), ``producer_group:NAME``,
``cluster``; a name ending in ``*`` matches every name with that prefix and ``*`` alone matches
every resource. Actions: ``pub``, ``sub``, ``admin`` (``all`` = the three).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

RESOURCE_TYPES = ("topic", "group", "producer_group", "cluster")
ACTIONS = ("pub", "sub", "admin")
DECISIONS = ("allow", "deny")


class PolicyError(ValueError):
    """The ACL file is not a valid policy (the message names the bad entry)."""


@dataclass(frozen=True, slots=True)
class Resource:
    """One resource a request touches: ``kind`` in RESOURCE_TYPES, ``name`` ("" for cluster)."""

    kind: str
    name: str = ""

    def __str__(self) -> str:
        return self.kind if self.kind == "cluster" else f"{self.kind}:{self.name}"


@dataclass(frozen=True, slots=True)
class Rule:
    kind: str  # a resource type, or "*" (every resource)
    pattern: str  # a name, a prefix ending in "*", or "*"
    actions: frozenset[str]
    allow: bool

    def matches(self, resource: Resource, action: str) -> bool:
        if action not in self.actions:
            return False
        if self.kind == "*":
            return True
        if self.kind != resource.kind:
            return False
        if resource.kind == "cluster" or self.pattern == "*":
            return True
        if self.pattern.endswith("*"):
            return resource.name.startswith(self.pattern[:-1])
        return resource.name == self.pattern


@dataclass(frozen=True, slots=True)
class User:
    name: str
    access_key: str
    secret_key: str = field(repr=False)  # never printed
    rules: tuple[Rule, ...] = ()


@dataclass(frozen=True, slots=True)
class Policy:
    users: Mapping[str, User]  # by access key
    default_allow: bool = False

    def user(self, access_key: str) -> User | None:
        return self.users.get(access_key)

    def allows(self, user: User, resource: Resource, action: str) -> bool:
        """Deny wins over allow; with no matching rule, the default policy decides."""
        allowed = False
        for rule in user.rules:
            if rule.matches(resource, action):
                if not rule.allow:
                    return False
                allowed = True
        return allowed or self.default_allow


def parse_resource(text: str) -> tuple[str, str]:
    """(kind, pattern) of a rule's resource; ``PolicyError`` naming what is wrong."""
    text = text.strip()
    if text == "*":
        return "*", "*"
    kind, sep, name = text.partition(":")
    kind = kind.strip().lower()
    if kind not in RESOURCE_TYPES:
        raise PolicyError(f"resource {text!r}: the type must be one of {', '.join(RESOURCE_TYPES)}"
                          " (as in topic:orders or topic:orders-*)")
    if kind == "cluster":
        return kind, "*"
    name = name.strip()
    if not sep or not name:
        raise PolicyError(f"resource {text!r}: name the {kind} after the colon (or use *)")
    if "*" in name[:-1]:
        raise PolicyError(f"resource {text!r}: * is only allowed at the end (a prefix)")
    return kind, name


def _actions(value: Any, where: str) -> frozenset[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise PolicyError(f"{where}: actions must be a non-empty list of {', '.join(ACTIONS)}")
    out: set[str] = set()
    for item in items:
        name = str(item).strip().lower()
        if name == "all":
            out.update(ACTIONS)
        elif name in ACTIONS:
            out.add(name)
        else:
            raise PolicyError(f"{where}: unknown action {item!r} (use {', '.join(ACTIONS)}, all)")
    return frozenset(out)


def _rule(raw: Any, where: str) -> Rule:
    if not isinstance(raw, dict):
        raise PolicyError(f"{where}: a rule is a mapping with resource, actions, decision")
    unknown = set(raw) - {"resource", "actions", "decision"}
    if unknown:
        raise PolicyError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    kind, pattern = parse_resource(str(raw.get("resource", "")))
    decision = str(raw.get("decision", "allow")).strip().lower()
    if decision not in DECISIONS:
        raise PolicyError(f"{where}: decision must be allow or deny, got {decision!r}")
    return Rule(kind, pattern, _actions(raw.get("actions"), where), decision == "allow")


def _user(raw: Any, where: str) -> User:
    if not isinstance(raw, dict):
        raise PolicyError(f"{where}: a user is a mapping with name, access_key, secret_key, rules")
    name = str(raw.get("name", "")).strip()
    ak, sk = raw.get("access_key"), raw.get("secret_key")
    for label, value in (("access_key", ak), ("secret_key", sk)):
        if not isinstance(value, str) or not value.strip():
            raise PolicyError(f"{where} ({name or 'unnamed'}): {label} must be a non-empty string")
    assert isinstance(ak, str) and isinstance(sk, str)
    if any(c in ak for c in " ,="):
        raise PolicyError(f"{where} ({name}): access_key must not contain spaces, commas or =")
    rules = raw.get("rules") or []
    if not isinstance(rules, list):
        raise PolicyError(f"{where} ({name}): rules must be a list")
    return User(name or ak, ak.strip(), sk,
                tuple(_rule(r, f"{where} ({name}) rule {j + 1}") for j, r in enumerate(rules)))


def parse_policy(raw: Any) -> Policy:
    """A policy from the loaded YAML document."""
    if not isinstance(raw, dict):
        raise PolicyError("the ACL file must be a mapping with 'users' (and 'default')")
    default = str(raw.get("default", "deny")).strip().lower()
    if default not in DECISIONS:
        raise PolicyError(f"default must be allow or deny, got {default!r}")
    users_raw = raw.get("users") or []
    if not isinstance(users_raw, list):
        raise PolicyError("users must be a list")
    users: dict[str, User] = {}
    for i, item in enumerate(users_raw):
        user = _user(item, f"users[{i}]")
        if user.access_key in users:
            raise PolicyError(f"users[{i}] ({user.name}): access_key is used twice")
        users[user.access_key] = user
    return Policy(users, default == "allow")


def user_entry(name: str, access_key: str, secret_key: str,
               rules: Iterable[tuple[str, list[str]]]) -> dict[str, Any]:
    """One user as the ACL file writes it (``tidemq up`` adds service accounts this way)."""
    return {"name": name, "access_key": access_key, "secret_key": secret_key,
            "rules": [{"resource": r, "actions": a, "decision": "allow"} for r, a in rules]}
