"""The README and docs/ cite only files inside the repository, every relative link resolves
(anchors included), and source comments cite the contract as ``docs/api.md``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.procs import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#+ (.+?)\s*$", re.M)
CODE_DIRS = ("services", "sdk", "tests", "bench", "deploy")
BARE_API_MD = re.compile(r"(?<!docs/)\bAPI\.md\b")


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens, repeats
    numbered."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    seen: dict[str, int] = {}
    out = set()
    for title in HEADING.findall(text):
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_resolve_inside_the_repository(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.is_relative_to(REPO) or not file.exists():
            broken.append(f"{target}: no such file in the repository")
        elif anchor and anchor not in anchors(file):
            broken.append(f"{target}: no heading with that anchor in {file.name}")
    assert not broken, f"{page.name}:\n" + "\n".join(broken)
    assert "shared/" not in page.read_text(), f"{page.name} cites a file outside the repository"


def test_code_cites_the_contract_inside_the_repository() -> None:
    bare = []
    for folder in CODE_DIRS:
        for path in sorted((REPO / folder).rglob("*")):
            if path.suffix not in (".py", ".md", ".yml", ".yaml", ".sh", ".toml") or \
                    ".venv" in path.parts:
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if BARE_API_MD.search(line):
                    bare.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not bare, "cite the contract as docs/api.md:\n" + "\n".join(bare)
