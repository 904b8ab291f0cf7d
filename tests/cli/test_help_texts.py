"""What a fresh `tidemq up` prints and answers, run as a real process group with its output in a
file (not a terminal) and no COLUMNS, as under a supervisor or a pipe:

- the endpoint table names every service in full (two nameservers were both "nameserver…");
- a fresh cluster's nameservers answer 404 for an unknown topic as soon as its brokers have
  registered, with the default 30 s warm-up left on (they were 503 for the whole warm-up);
- `tidemq --help` and each group's help list every command's sentence unbroken.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from services.cli import app
from tests.support.procs import REPO
from tests.support.up import UpRun, free_base

pytestmark = pytest.mark.integration


def test_a_fresh_up_prints_full_names_and_knows_unknown_topics(tmp_path: Path) -> None:
    ns, broker = free_base(2, 1), free_base(1, 1)
    checker, scheduler = free_base(1, 1), free_base(1, 1)
    up = UpRun(tmp_path, "--nameservers", "2", "--nameserver-port", str(ns),
               "--broker-port", str(broker), "--checker-port", str(checker),
               "--scheduler-port", str(scheduler), "--grpc-port", "0", "--no-metrics",
               "--skip", "console", "--stop-timeout", "20",
               env={"COLUMNS": "", "TIDEMQ_NAMESRV_WARMUP_S": "30"})
    try:
        up.wait_ready(120)
        out = up.output()
        table = out[out.index("tidemq is up"):]
        assert "…" not in table, table
        for name, port in (("nameserver-1", ns), ("nameserver-2", ns + 1)):
            line = next(ln for ln in table.splitlines() if f":{port}" in ln)
            assert name in line, line
        for port in (ns, ns + 1):  # ready means the broker registered: no 30 s of 503
            resp = httpx.get(f"http://127.0.0.1:{port}/v1/routes/NoSuchTopic", timeout=5)
            assert resp.status_code == 404, resp.text
            assert resp.json()["code"] == "TOPIC_NOT_FOUND"
        assert up.stop() == 0, up.output()
    finally:
        up.kill()


def _helps(typer_app: object, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str]]:
    """(command path, first paragraph on one line) of every command and group."""
    found = []
    for command in typer_app.registered_commands:  # type: ignore[attr-defined]
        doc = inspect.cleandoc(command.help or inspect.getdoc(command.callback) or "")
        found.append(((*prefix, command.name or command.callback.__name__),
                      " ".join(doc.split("\n\n")[0].split())))
    for group in typer_app.registered_groups:  # type: ignore[attr-defined]
        found += _helps(group.typer_instance, (*prefix, group.name))
    return found


def test_help_lists_every_sentence_unbroken() -> None:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env["COLUMNS"] = "1000"  # so wide that only a hard line break can split a sentence
    outputs: dict[tuple[str, ...], str] = {}
    for path, sentence in _helps(app):
        parent = path[:-1]
        if parent not in outputs:
            outputs[parent] = subprocess.run(
                [sys.executable, "-m", "services.cli", *parent, "--help"], cwd=REPO, env=env,
                capture_output=True, text=True, timeout=60, check=True).stdout
        rows = [re.sub(r"\s+", " ", ln.strip(" │")) for ln in outputs[parent].splitlines()]
        assert any(row.endswith(sentence) or sentence in row for row in rows), (path, sentence)
