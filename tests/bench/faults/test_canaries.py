"""The canaries (bench/_faults/canaries/) still apply to the tree and each names a check of the
checker; a skipped faults run does not pass silently. Cheap: no run of the suite here
(``python -m bench.faults --canaries`` runs them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import bench.faults
from bench._faults.canary import ROOT, apply, copy_tree, load, tree_env
from bench._faults.checker import VIOLATIONS

EXPECTED = {"ack_without_store": "lost", "early_timer": "early_timers",
            "rollback_delivered": "aborted_read", "retry_stored_twice": "duplicates",
            "pull_skips_record": "skipped_by_group",
            "offset_past_unprocessed": "offsets_forward", "sdk_retry_new_id": "unexpected"}


def test_every_canary_names_a_check_and_applies_to_the_tree() -> None:
    canaries = load()
    assert {c.name: c.check for c in canaries} == EXPECTED
    for canary in canaries:
        assert canary.check in VIOLATIONS, canary
        assert canary.bug, canary
        why = apply(canary, ROOT, check_only=True)
        assert why is None, f"canary {canary.name} no longer applies: update it ({why})"


def test_a_skipped_run_fails_unless_skips_are_allowed(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    monkeypatch.setattr(bench.faults, "available", lambda: "not root")
    assert bench.faults.main(["--quick", "--json"]) == bench.faults.SKIPPED != 0
    assert '"skipped": "not root"' in capsys.readouterr().out
    assert bench.faults.main(["--quick", "--allow-skip"]) == 0


def test_a_canary_run_imports_the_patched_copy(tmp_path: Path) -> None:
    """The services and the SDK a canary's run imports are the copy's, not the installed tree's
    (after the services became ``tidemq_server``, a run under a canary imported the installed,
    unpatched services: only the SDK's canary could be caught)."""
    copy_tree(tmp_path)
    probe = "import tidemq, tidemq_server.broker.service as s; print(tidemq.__file__, s.__file__)"
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=tree_env(tmp_path),
                          capture_output=True, text=True, check=True)
    sdk, broker = done.stdout.split()
    assert Path(sdk).resolve().is_relative_to(tmp_path.resolve())
    assert Path(broker).resolve().is_relative_to(tmp_path.resolve())
