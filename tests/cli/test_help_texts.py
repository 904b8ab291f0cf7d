"""Every command's help reads whole: `tidemq --help` and each group's help list every command's
first sentence unbroken (the lists kept the docstrings' line breaks, so sentences broke in the
middle). Through the real CLI app in-process, at a width where only a hard break can split."""

from __future__ import annotations

import inspect
import re
from typing import Any

from typer.testing import CliRunner

from tidemq_server.cli import app


def _helps(typer_app: Any, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str]]:
    """(command path, first paragraph on one line) of every command and group."""
    found = []
    for command in typer_app.registered_commands:
        doc = inspect.cleandoc(command.help or inspect.getdoc(command.callback) or "")
        found.append(((*prefix, command.name or command.callback.__name__),
                      " ".join(doc.split("\n\n")[0].split())))
    for group in typer_app.registered_groups:
        found += _helps(group.typer_instance, (*prefix, group.name))
    return found


def test_help_lists_every_sentence_unbroken() -> None:
    outputs: dict[tuple[str, ...], str] = {}
    helps = _helps(app)
    assert len(helps) >= 15, helps  # every command of every group
    for path, sentence in helps:
        parent = path[:-1]
        if parent not in outputs:
            result = CliRunner().invoke(app, [*parent, "--help"], env={"COLUMNS": "1000"})
            assert result.exit_code == 0, result.output
            outputs[parent] = result.output
        rows = [re.sub(r"\s+", " ", ln.strip(" │")) for ln in outputs[parent].splitlines()]
        assert any(sentence in row for row in rows), (path, sentence, outputs[parent])
