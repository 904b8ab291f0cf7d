"""Grafana's admin password is documented one way: the compose file's variable and default."""

from __future__ import annotations

import re

import yaml

from tests.support.procs import REPO

DOCS = [REPO / "README.md", REPO / "deploy" / "README.md", REPO / "docker-compose.yml"]


def test_every_mention_of_the_grafana_password_matches_compose() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    setting = compose["services"]["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
    found = re.fullmatch(r"\$\{(\w+):-(\w+)\}", setting)
    assert found, setting
    variable, default = found.groups()

    mentions = 0
    for doc in DOCS:
        text = doc.read_text()
        # a user/password pair written as "admin/admin" or "admin / x" states another password
        assert not re.search(r"\badmin\s*/\s*\S", text), f"{doc}: password written as a pair"
        for line in text.splitlines():
            if variable in line and "GF_SECURITY" not in line:
                mentions += 1
        if variable in text:
            assert f'"{default}" when unset' in " ".join(text.split()), doc
    assert mentions >= 2  # the compose header and deploy/README.md both say it
