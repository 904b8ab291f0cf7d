"""The ACL file, loaded at start and reloaded when it changes.

``AclStore.policy()`` looks at the file's modification time at most every ``check_s`` seconds
(a ``stat``, no background task). A changed file that does not load keeps the last good policy,
and the log says why; a file that does not load at start fails the service's start.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import yaml

from services.common.auth.policy import Policy, PolicyError, parse_policy

log = logging.getLogger(__name__)

ACL_CHECK_S = 1.0  # the ACL file's modification time is looked at this often at most (s)


def load_policy(path: Path) -> Policy:
    """The policy of an ACL file; ``PolicyError`` saying what is wrong with it."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError(f"{path} is not valid YAML: {str(exc).splitlines()[0]}") from exc
    return parse_policy(raw)


class AclStore:
    def __init__(self, path: Path | str, check_s: float = ACL_CHECK_S) -> None:
        self.path = Path(path)
        self.check_s = check_s
        self.reloads = 0  # successful loads after the first
        self.failures = 0  # changed files that did not load
        self.last_error = ""
        self._stamp = self._mtime()
        self._policy = load_policy(self.path)
        self._checked = time.monotonic()
        log.info("ACL on: %d account(s) from %s (default: %s)", len(self._policy.users),
                 self.path, "allow" if self._policy.default_allow else "deny")

    def _mtime(self) -> tuple[int, int]:
        try:
            st = os.stat(self.path)
        except OSError:
            return (0, 0)
        return (st.st_mtime_ns, st.st_size)

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
            policy = load_policy(self.path)
        except PolicyError as exc:
            self.failures += 1
            self.last_error = str(exc)
            log.error("ACL file changed but was NOT loaded, the previous rules stay in force: %s",
                      exc)
            return False
        self._policy = policy
        self.reloads += 1
        self.last_error = ""
        log.info("ACL file reloaded: %d account(s) from %s", len(policy.users), self.path)
        return True
