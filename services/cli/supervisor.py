"""The children of one `tidemq up`: start each until healthy, restart any that dies, stop all.

A child that dies while the cluster runs is restarted with the same command and environment
after a back-off (``RESTART_BACKOFF_S`` doubling up to ``MAX_BACKOFF_S``) and one line says so
(``scheduler exited by SIGKILL; restarted (2nd time)``); the others keep running. A service
whose runs keep failing is in a crash loop: ``CRASH_LOOP_DEATHS`` failed runs within
``CRASH_LOOP_WINDOW_S`` end supervision and `tidemq up` stops everything. A run failed when it
never became healthy or died before living ``STABLE_RUN_S``; a death after a stable run (say an
operator's SIGKILL) is only restarted, and a stable run clears the count of earlier failures.
Restarts never block: the loop keeps watching the other children while one waits for its
back-off or its health check.

A running child that was healthy is probed every ``HEALTH_CHECK_S``. When it answers "unhealthy"
(HTTP 503, ``Unhealthy``) for ``UNHEALTHY_RESTART_S`` in a row, say a broker whose store writer
stopped, it is sent SIGTERM (SIGKILL after the stop timeout) with a line saying why, and the
restart path above takes over. A probe that gets no answer neither starts nor ends that streak.

One stop request gives every child its whole graceful timeout, however many signals carry it:
``make up`` forwards the SIGTERM its process group already got, so a second signal often arrives
at once. Only a Ctrl-C pressed again ``DUPLICATE_SIGNAL_S`` or more after the first skips the wait.
"""

from __future__ import annotations

import ctypes
import logging
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import redis
from rich.table import Table

from tidemq_server.cli import notices
from tidemq_server.cli.rest import CliError, err_console
from tidemq_server.common.tls import client_context

POLL_S = 0.1  # how often a starting child's health is polled (s)
WATCH_S = 0.2  # how often running children are looked at (s)
PROBE_TIMEOUT_S = 0.5  # one health probe (s)
LOG_TAIL_LINES = 30
DUPLICATE_SIGNAL_S = 2.0  # signals this soon after the first one are the same stop request
RESTART_BACKOFF_S = 0.5  # wait before the first restart; doubles with each recent death (s)
MAX_BACKOFF_S = 8.0  # longest wait before a restart (s)
CRASH_LOOP_DEATHS = 5  # this many failed runs of one service …
CRASH_LOOP_WINDOW_S = 60.0  # … within this window (s) stop everything
STABLE_RUN_S = 5.0  # a healthy run that lived this long did not fail, whatever ended it (s)
HEALTH_CHECK_S = 1.0  # how often a running, healthy child's health is probed (s)
UNHEALTHY_RESTART_S = 10.0  # restart a child that answers "unhealthy" (503) this long (s)
PR_SET_PDEATHSIG = 1  # linux/prctl.h

Probe = Callable[[], bool]  # True once the child serves (may raise while it does not)
HEALTHY, UNHEALTHY, UNREACHABLE = "healthy", "unhealthy", "unreachable"  # health_of() outcomes


class Interrupted(Exception):
    """A stop was requested (Ctrl-C or SIGTERM) while starting."""


class Unhealthy(Exception):
    """Raised by a probe whose child answered that it cannot work (HTTP 503); says why."""


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM if `tidemq up` itself dies (Linux)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def http_probe(url: str) -> Probe:
    def probe() -> bool:
        response = httpx.get(url, timeout=PROBE_TIMEOUT_S, verify=client_context())
        if response.status_code == 503:
            raise Unhealthy(_error_text(response))
        return response.status_code == 200
    return probe


def _error_text(response: httpx.Response) -> str:
    """``UNAVAILABLE: store writer stopped`` from a ``{code, message}`` answer."""
    try:
        body = response.json()
        return f"{body['code']}: {body['message']}"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {response.status_code}"


def redis_probe(host: str, port: int) -> Probe:
    def probe() -> bool:
        client = redis.Redis(host=host, port=port, socket_timeout=PROBE_TIMEOUT_S)
        try:
            return bool(client.ping())
        finally:
            client.close()
    return probe


def health_of(probe: Probe) -> tuple[str, str]:
    """(HEALTHY | UNHEALTHY | UNREACHABLE, why): UNHEALTHY only when the child answered so."""
    try:
        return (HEALTHY, "") if probe() else (UNREACHABLE, "not ready")
    except Unhealthy as exc:
        return UNHEALTHY, str(exc)
    except (httpx.HTTPError, redis.RedisError, OSError) as exc:
        return UNREACHABLE, type(exc).__name__


def probe_ok(probe: Probe) -> bool:
    return health_of(probe)[0] == HEALTHY


def exit_words(code: int | None) -> str:
    """How a child ended, for the restart line: ``by SIGKILL``, ``with status 1``."""
    if code is None:
        return "still running"
    if code < 0:
        return f"by {signal.Signals(-code).name}"
    return "cleanly" if code == 0 else f"with status {code}"


def describe_status(code: int | None) -> str:
    """A stopped child's exit status in words: uvicorn re-raises SIGTERM after a clean
    shutdown."""
    if code is None:
        return "still running"
    if code in (0, -signal.SIGTERM, -signal.SIGINT):
        return "cleanly"
    if code < 0:
        return f"by signal {signal.Signals(-code).name}"
    return f"with status {code}"


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


@dataclass
class Child:
    """One supervised process and what is needed to run it again."""

    name: str
    url: str
    docs_url: str
    argv: list[str]
    env: dict[str, str]
    probe: Probe
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    log_start: int = 0  # where this run's output begins in the log file
    restarts: int = 0
    deaths: deque[float] = field(default_factory=deque)  # monotonic times of recent failed runs
    restart_at: float | None = None  # dead, to be restarted at this monotonic time
    how: str = ""  # how the last run ended (exit_words)
    recovering_since: float | None = None  # restarted, not yet healthy again
    # this run, in monotonic seconds
    started_at: float = 0.0  # spawned
    healthy_at: float | None = None  # first passed its probe (None: not yet)
    checked_at: float = 0.0  # last health probe while running
    unhealthy_since: float | None = None  # first of the current streak of "unhealthy" answers
    terminated_at: float | None = None  # sent SIGTERM for being unhealthy (SIGKILL later)

    def tail(self, lines: int = LOG_TAIL_LINES) -> list[str]:
        try:
            with self.log_path.open("rb") as f:
                f.seek(self.log_start)
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return []
        return text.splitlines()[-lines:]

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Supervisor:
    """Starts, watches, restarts and stops the children of one `tidemq up`."""

    def __init__(self, data_dir: Path, start_timeout_s: float, stop_timeout_s: float) -> None:
        self.data_dir = data_dir.resolve()
        self.log_dir = self.data_dir / "logs"
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.children: list[Child] = []
        self.stop_requested = False
        self.force = False
        self._first_signal_at: float | None = None  # time.monotonic() of the first stop signal
        self._previous: dict[int, Any] = {}

    # --- signals ------------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def restore_signal_handlers(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum: int, _: FrameType | None) -> None:
        now = time.monotonic()
        if self._first_signal_at is None:
            self._first_signal_at = now
        elif (signum == signal.SIGINT
              and now - self._first_signal_at >= DUPLICATE_SIGNAL_S):
            self.force = True  # Ctrl-C pressed again later: stop waiting for children, kill them
        # Any other repeat (make forwarding the group's SIGTERM, a second SIGTERM from a
        # supervisor) is the same request: the children keep their graceful timeout.
        self.stop_requested = True

    # --- starting -----------------------------------------------------------------------------

    def _spawn(self, child: Child, what: str) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with child.log_path.open("ab") as log:
            log.write(notices.banner(f"tidemq up: {child.name} {what}").encode())
            log.flush()
            child.log_start = log.tell()
            child.started_at = child.checked_at = time.monotonic()
            child.healthy_at = child.unhealthy_since = child.terminated_at = None
            child.proc = subprocess.Popen(child.argv, env=child.env, stdin=subprocess.DEVNULL,
                                          stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True, preexec_fn=_die_with_parent)

    def start(self, name: str, argv: list[str], env: dict[str, str], url: str, docs_url: str,
              probe: Probe) -> Child:
        """Start a child and wait until ``probe`` passes; CliError if it dies or times out."""
        child = Child(name, url, docs_url, argv, env, probe, self.log_dir / f"{name}.log")
        self._spawn(child, "starting")
        self.children.append(child)
        self._wait(child)
        return child

    def _wait(self, child: Child) -> None:
        started = time.monotonic()
        with notices.status(f"starting {child.name} …"):
            while True:
                if self.stop_requested:
                    raise Interrupted
                assert child.proc is not None
                if child.proc.poll() is not None:
                    self.report_death(child)
                    raise CliError(f"{child.name} exited while starting "
                                   f"(log: {child.log_path})")
                if probe_ok(child.probe):
                    child.healthy_at = time.monotonic()
                    break
                if time.monotonic() - started > self.start_timeout_s:
                    self.report_death(child, "is not healthy")
                    raise CliError(f"{child.name} not healthy after {self.start_timeout_s:.0f} s "
                                   f"(log: {child.log_path})")
                time.sleep(POLL_S)
        notices.say(f"[green]✓[/] {child.name} ready at {child.url} "
                    f"({time.monotonic() - started:.1f} s)")

    # --- running: restart what dies -----------------------------------------------------------

    def supervise(self) -> str | None:
        """Watch until a stop is requested (None) or a service is in a crash loop (why)."""
        while not self.stop_requested:
            now = time.monotonic()
            for child in self.children:
                if child.restart_at is not None:
                    if now >= child.restart_at:
                        self._restart(child)
                elif not child.running():
                    crash_loop = self._died(child, now)
                    if crash_loop:
                        return crash_loop
                elif child.recovering_since is not None:
                    if probe_ok(child.probe):
                        notices.say(f"[green]✓[/] {child.name} ready again at {child.url} "
                                    f"({now - child.recovering_since:.1f} s)")
                        child.recovering_since = None
                        child.healthy_at = now
                else:
                    self._watch_health(child, now)
                if (child.deaths and child.healthy_at is not None and child.running()
                        and now - child.started_at >= STABLE_RUN_S):
                    child.deaths.clear()  # a stable run: earlier failures are forgiven
            time.sleep(WATCH_S)
        return None

    def _watch_health(self, child: Child, now: float) -> None:
        """Probe a running, healthy child now and then; stop it (to be restarted) once it has
        answered "unhealthy" for ``UNHEALTHY_RESTART_S``."""
        assert child.proc is not None
        if child.terminated_at is not None:
            if now - child.terminated_at >= self.stop_timeout_s:
                notices.say(f"{child.name} did not stop in time: killing it", err=True,
                            level=logging.WARNING, style="yellow", highlight=False)
                child.proc.kill()
                child.terminated_at = now  # do not kill again while it goes
            return
        if now - child.checked_at < HEALTH_CHECK_S:
            return
        child.checked_at = now
        state, why = health_of(child.probe)
        if state == HEALTHY:
            child.unhealthy_since = None
        elif state == UNHEALTHY:
            if child.unhealthy_since is None:
                child.unhealthy_since = now
            elif now - child.unhealthy_since >= UNHEALTHY_RESTART_S:
                notices.say(f"{child.name} unhealthy for {now - child.unhealthy_since:.0f}"
                            f" s ({why}): stopping it to restart it", err=True, markup=False,
                            level=logging.WARNING, style="yellow", highlight=False,
                            soft_wrap=True)
                child.proc.send_signal(signal.SIGTERM)
                child.terminated_at = now

    def _died(self, child: Child, now: float) -> str | None:
        assert child.proc is not None
        child.how = exit_words(child.proc.returncode)
        if child.healthy_at is None or now - child.started_at < STABLE_RUN_S:
            child.deaths.append(now)  # a failed run: it counts toward a crash loop
        while child.deaths and now - child.deaths[0] > CRASH_LOOP_WINDOW_S:
            child.deaths.popleft()
        if len(child.deaths) >= CRASH_LOOP_DEATHS:
            self.report_death(child)
            return (f"{child.name} exited {child.how}, its {ordinal(len(child.deaths))} failed "
                    f"run within {CRASH_LOOP_WINDOW_S:.0f} s (a crash loop)")
        delay = min(MAX_BACKOFF_S, RESTART_BACKOFF_S * 2 ** max(0, len(child.deaths) - 1))
        child.restart_at = now + delay
        if delay >= 1:
            notices.say(f"{child.name} exited {child.how}; restarting in {delay:.0f} s "
                        f"(log: {child.log_path})", err=True, level=logging.WARNING,
                        style="yellow", highlight=False)
        return None

    def _restart(self, child: Child) -> None:
        child.restart_at = None
        child.restarts += 1
        self._spawn(child, f"restarting ({ordinal(child.restarts)} time)")
        child.recovering_since = time.monotonic()
        notices.say(f"{child.name} exited {child.how}; restarted "
                    f"({ordinal(child.restarts)} time)", err=True, level=logging.WARNING,
                    style="yellow", highlight=False)

    def report_death(self, child: Child, what: str | None = None) -> None:
        code = child.proc.returncode if child.proc is not None else None
        status = what or f"exited {describe_status(code)}"
        if notices.json_on():  # one line, the log's tail in a field
            notices.say(f"{child.name} {status}", level=logging.ERROR, markup=False,
                        fields={"log": str(child.log_path), "log_tail": child.tail()})
            return
        err_console.print(f"[bold red]{child.name} {status}[/]; last lines of {child.log_path}:")
        for line in child.tail():
            err_console.print("  " + line, markup=False, highlight=False, style="dim",
                              soft_wrap=True)

    # --- stopping -----------------------------------------------------------------------------

    def stop_all(self) -> None:
        """Stop every child in reverse start order: SIGTERM, then SIGKILL after the timeout."""
        self.stop_requested = True
        for child in reversed(self.children):
            proc = child.proc
            if proc is None or proc.poll() is not None:
                continue  # dead already (waiting for its restart, or just died)
            proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + self.stop_timeout_s
            while proc.poll() is None and time.monotonic() < deadline and not self.force:
                time.sleep(POLL_S / 2)
            if proc.poll() is None:
                notices.say(f"{child.name} did not stop in time: killing it", err=True,
                            level=logging.WARNING)
                proc.kill()
            proc.wait()
            notices.say(f"stopped {child.name} {describe_status(proc.returncode)}")
        self.children.clear()

    def endpoints_table(self) -> Table:
        table = Table(title="tidemq is up", caption=f"logs in {self.log_dir}")
        table.add_column("service", style="bold")
        table.add_column("URL", no_wrap=True)
        table.add_column("docs", no_wrap=True)
        for child in self.children:
            table.add_row(child.name, child.url, child.docs_url or "-")
        return table
