"""The supervisor of `tidemq up` with real (tiny) child processes: only failed runs count toward
a crash loop, and a child that keeps answering "unhealthy" is stopped and restarted."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.cli.test_supervisor import SLEEPER, always, run_in_thread
from tests.support.wait import quiet_for, wait_until
from tidemq_server.cli import supervisor as sup_module
from tidemq_server.cli.supervisor import HEALTHY, UNHEALTHY, Supervisor, Unhealthy, health_of

SHORT_LIVED = [sys.executable, "-c", "import time; time.sleep(0.4)"]
DEAF_TO_SIGTERM = [sys.executable, "-c", "import signal, time; "
                   "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"]


class Switch:
    """A probe the test turns: healthy, not ready (False), or answering 503."""

    def __init__(self) -> None:
        self.state = HEALTHY

    def __call__(self) -> bool:
        if self.state == UNHEALTHY:
            raise Unhealthy("UNAVAILABLE: store writer stopped")
        return self.state == HEALTHY


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sup_module, "RESTART_BACKOFF_S", 0.05)
    monkeypatch.setattr(sup_module, "STABLE_RUN_S", 0.3)
    monkeypatch.setattr(sup_module, "HEALTH_CHECK_S", 0.05)
    monkeypatch.setattr(sup_module, "UNHEALTHY_RESTART_S", 0.5)


def test_check_tells_an_unhealthy_answer_from_no_answer() -> None:
    def refused() -> bool:
        raise httpx.ConnectError("refused")

    assert health_of(always) == (HEALTHY, "")
    assert health_of(Switch()) == (HEALTHY, "")
    unhealthy = Switch()
    unhealthy.state = UNHEALTHY
    assert health_of(unhealthy) == (UNHEALTHY, "UNAVAILABLE: store writer stopped")
    assert health_of(refused)[0] == "unreachable"
    assert health_of(lambda: False)[0] == "unreachable"


def test_killing_a_healthy_child_again_and_again_is_no_crash_loop(
        tmp_path: Path, fast: None, capsys: pytest.CaptureFixture[str]) -> None:
    sup = Supervisor(tmp_path, start_timeout_s=10, stop_timeout_s=5)
    child = sup.start("broker-a", SLEEPER, dict(os.environ), "-", "", always)
    thread, result = run_in_thread(sup)
    try:
        for n in range(1, sup_module.CRASH_LOOP_DEATHS + 2):
            wait_until(lambda: child.running() and child.healthy_at is not None
                       and time.monotonic() - child.started_at >= sup_module.STABLE_RUN_S)
            old = child.proc
            assert old is not None
            old.send_signal(signal.SIGKILL)
            wait_until(lambda o=old: child.proc is not o and child.running())  # type: ignore[misc]
            assert child.restarts == n
        assert thread.is_alive() and result == []
        assert len(child.deaths) == 0
    finally:
        sup.stop_requested = True
        thread.join(5)
        sup.stop_all()
    assert result == [None]
    assert "crash loop" not in capsys.readouterr().err


def test_runs_that_never_become_healthy_are_a_crash_loop(
        tmp_path: Path, fast: None, capsys: pytest.CaptureFixture[str]) -> None:
    probe = Switch()
    sup = Supervisor(tmp_path, start_timeout_s=10, stop_timeout_s=5)
    child = sup.start("broker-a", SLEEPER, dict(os.environ), "-", "", probe)
    wait_until(lambda: child.healthy_at is not None  # the first run was healthy and stable
               and time.monotonic() - child.started_at >= sup_module.STABLE_RUN_S)
    probe.state = "not ready"
    child.argv = SHORT_LIVED  # every restart lives longer than STABLE_RUN_S, never healthy
    assert child.proc is not None
    child.proc.kill()
    try:
        reason = sup.supervise()
    finally:
        sup.stop_all()
    assert reason is not None
    assert f"its {sup_module.CRASH_LOOP_DEATHS}th failed run" in reason
    # the stable first run did not count: five failed restarts did
    assert child.restarts == sup_module.CRASH_LOOP_DEATHS
    assert "broker-a exited cleanly" in reason


def test_quick_deaths_of_a_healthy_child_are_a_crash_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sup_module, "RESTART_BACKOFF_S", 0.05)
    monkeypatch.setattr(sup_module, "STABLE_RUN_S", 30.0)
    sup = Supervisor(tmp_path, start_timeout_s=10, stop_timeout_s=5)
    child = sup.start("broker-a", SHORT_LIVED, dict(os.environ), "-", "", always)
    try:
        reason = sup.supervise()  # each run is healthy but lives 0.4 s
    finally:
        sup.stop_all()
    assert reason is not None and "crash loop" in reason
    assert child.restarts == sup_module.CRASH_LOOP_DEATHS - 1


@pytest.mark.parametrize("argv", [SLEEPER, DEAF_TO_SIGTERM], ids=["sigterm", "sigkill"])
def test_a_child_answering_unhealthy_is_restarted(
        tmp_path: Path, fast: None, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    probe = Switch()
    sup = Supervisor(tmp_path, start_timeout_s=10, stop_timeout_s=0.5)
    child = sup.start("broker-a", argv, dict(os.environ), "-", "", probe)
    other = sup.start("other", SLEEPER, dict(os.environ), "-", "", always)
    first = child.proc
    thread, result = run_in_thread(sup)
    try:
        probe.state = "not ready"  # no answer: not a reason to restart
        assert quiet_for(lambda: (child.proc, child.restarts),
                         sup_module.UNHEALTHY_RESTART_S * 2, "restarts") == (first, 0)
        probe.state = UNHEALTHY
        started = time.monotonic()
        wait_until(lambda: child.restarts == 1)
        assert time.monotonic() - started >= sup_module.UNHEALTHY_RESTART_S
        probe.state = HEALTHY
        wait_until(lambda: child.recovering_since is None and child.running())
        assert quiet_for(lambda: (child.restarts, other.restarts),  # healthy again: left alone
                         sup_module.UNHEALTHY_RESTART_S * 2, "restarts") == (1, 0)
    finally:
        sup.stop_requested = True
        thread.join(5)
        sup.stop_all()
    assert result == [None]
    err = capsys.readouterr().err
    assert "broker-a unhealthy for" in err
    assert "(UNAVAILABLE: store writer stopped): stopping it to restart it" in err
    how = "SIGTERM" if argv is SLEEPER else "SIGKILL"
    assert f"broker-a exited by {how}; restarted (1st time)" in err
    assert ("broker-a did not stop in time: killing it" in err) == (how == "SIGKILL")
