"""The ACL file, loaded at start and reloaded when it changes.

``AclStore.policy()`` looks at the file's modification time at most every ``check_s`` seconds
(a ``stat``, no background task). A changed file that does not load keeps the last good policy,
and the log says why; a file that does not load at start fails the service's start.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from tidemq_server.common.auth.policy import Policy, PolicyError, parse_policy
from tidemq_server.common.constants import ACL_CHECK_S

log = logging.getLogger(__name__)


def split_paths(value: str | Path | Sequence[Path]) -> list[Path]:
    """ACL files: one path, or several comma-separated (``tidemq up`` adds its services' file)."""
    if isinstance(value, Path):
        return [value]
    if isinstance(value, str):
        return [Path(p.strip()) for p in value.split(",") if p.strip()]
    return list(value)


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError(f"{path} is not valid YAML: {str(exc).splitlines()[0]}") from exc
    if not isinstance(raw, dict):
        raise PolicyError(f"{path}: the ACL file must be a mapping with 'users' (and 'default')")
    return raw


def load_policy(paths: str | Path | Sequence[Path]) -> Policy:
    """The policy of one or more ACL files (the users of all, the default of the first);
    ``PolicyError`` saying what is wrong and in which file."""
    files = split_paths(paths)
    if not files:
        raise PolicyError("no ACL file given")
    merged: dict[str, Any] = {}
    users: list[Any] = []
    for path in files:
        raw = _read(path)
        part = raw.get("users") or []
        if not isinstance(part, list):
            raise PolicyError(f"{path}: users must be a list")
        users += part
        if not merged:
            merged = dict(raw)
    merged["users"] = users
    return parse_policy(merged)


class AclStore:
    def __init__(self, path: Path | str, check_s: float = ACL_CHECK_S) -> None:
        self.paths = split_paths(path)
        self.path = self.paths[0] if self.paths else Path()
        self.check_s = check_s
        self.reloads = 0  # successful loads after the first
        self.failures = 0  # changed files that did not load
        self.last_error = ""
        self._stamp = self._mtime()
        self._policy = load_policy(self.paths)
        self._checked = time.monotonic()
        log.info("ACL on: %d account(s) from %s (default: %s)", len(self._policy.users),
                 ", ".join(map(str, self.paths)), "allow" if self._policy.default_allow else "deny")

    def _mtime(self) -> tuple[tuple[int, int], ...]:
        stamps = []
        for path in self.paths:
            try:
                st = os.stat(path)
            except OSError:
                stamps.append((0, 0))
            else:
                stamps.append((st.st_mtime_ns, st.st_size))
        return tuple(stamps)

    def policy(self) -> Policy:
        now = time.monotonic()
        if now - self._checked >= self.check_s:
            self._checked = now
            self.reload_if_changed()
        return self._policy

    def reload_if_changed(self) -> bool:
        """Load the file again when it changed; True when a new policy is in force."""
        stamp = self._mtime()
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            policy = load_policy(self.paths)
        except PolicyError as exc:
            self.failures += 1
            self.last_error = str(exc)
            log.error("ACL file changed but was NOT loaded, the previous rules stay in force: %s",
                      exc)
            return False
        self._policy = policy
        self.reloads += 1
        self.last_error = ""
        log.info("ACL file reloaded: %d account(s) from %s", len(policy.users),
                 ", ".join(map(str, self.paths)))
        return True
