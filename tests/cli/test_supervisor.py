"""The supervisor of `tidemq up` with real (tiny) child processes: a child that dies is
restarted with a line saying how it ended, the others keep running, and a crash loop ends
supervision."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from tests.support.wait import wait_until
from tidemq_server.cli import supervisor as sup_module
from tidemq_server.cli.supervisor import Supervisor, exit_words, ordinal

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]
CRASHER = [sys.executable, "-c", "raise SystemExit(3)"]


def always() -> bool:
    return True


def test_ordinal_and_exit_words() -> None:
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 103)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "103rd"]
    assert exit_words(-signal.SIGKILL) == "by SIGKILL"
    assert exit_words(3) == "with status 3"
    assert exit_words(0) == "cleanly"


def run_in_thread(sup: Supervisor) -> tuple[threading.Thread, list[str | None]]:
    result: list[str | None] = []
    thread = threading.Thread(target=lambda: result.append(sup.supervise()), daemon=True)
    thread.start()
    return thread, result


def test_a_killed_child_is_restarted_and_the_others_keep_running(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sup = Supervisor(tmp_path, start_timeout_s=10, stop_timeout_s=5)
    first = sup.start("first", SLEEPER, dict(os.environ), "-", "", always)
    second = sup.start("second", SLEEPER, dict(os.environ), "-", "", always)
    thread, result = run_in_thread(sup)
    try:
        for n in (1, 2):
            assert first.proc is not None
            old = first.proc
            old.send_signal(signal.SIGKILL)
            def replaced(o: object = old) -> bool:
                return first.proc is not o and first.running()
            wait_until(replaced)
            assert first.restarts == n
        assert second.running() and second.restarts == 0
    finally:
        sup.stop_requested = True
        thread.join(5)
        sup.stop_all()
    assert result == [None]
    err = capsys.readouterr().err
    assert "first exited by SIGKILL; restarted (1st time)" in err
    assert "first exited by SIGKILL; restarted (2nd time)" in err
    assert "second exited" not in err
    log = (tmp_path / "logs" / "first.log").read_text()
    assert "first restarting (2nd time)" in log


def test_a_crash_loop_ends_supervision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sup_module, "RESTART_BACKOFF_S", 0.05)
    sup = Supervisor(tmp_path, start_timeout_s=10, stop_timeout_s=5)
    # healthy at first (a sleeper), then every restart exits at once
    crashy = sup.start("crashy", SLEEPER, dict(os.environ), "-", "", always)
    other = sup.start("other", SLEEPER, dict(os.environ), "-", "", always)
    crashy.argv = CRASHER
    assert crashy.proc is not None
    crashy.proc.kill()
    try:
        reason = sup.supervise()  # returns: the crash loop ends supervision
    finally:
        sup.stop_all()
    assert reason is not None and "crashy exited with status 3" in reason
    assert f"its {sup_module.CRASH_LOOP_DEATHS}th failed run" in reason
    assert crashy.restarts == sup_module.CRASH_LOOP_DEATHS - 1
    assert other.restarts == 0
    out = capsys.readouterr()
    assert "crashy exited with status 3; restarted (4th time)" in out.err
    assert "stopped other cleanly" in out.out
