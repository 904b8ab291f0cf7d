"""Tests wait on facts, not clocks: at most ``BUDGET`` fixed sleeps of half a second or more are
left in tests/ (tests/support/fixed_sleeps.py counts them), each one a sleep that is the test's
claim ("silent past the expiry", "a promotion longer than the lease"). A new wait belongs in
``wait_until`` (the fact it waits for) or ``quiet_for`` (the window nothing may happen in).

The counter and ``quiet_for`` are checked here too, on files and values written for the purpose.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.fixed_sleeps import MIN_S, long_fixed_sleeps, sleeps
from tests.support.wait import quiet_for, quiet_for_async

BUDGET = 10  # fixed sleeps of MIN_S (0.5 s) or longer allowed in tests/


def test_few_fixed_sleeps_are_left_in_the_tests() -> None:
    found = long_fixed_sleeps()
    assert len(found) <= BUDGET, (
        f"{len(found)} fixed sleeps of {MIN_S} s or longer (at most {BUDGET}); wait on the "
        "fact (tests.support.wait.wait_until) or claim a quiet window (quiet_for):\n"
        + "\n".join(map(str, found)))


def test_the_counter_reads_literals_constants_and_imported_constants(tmp_path: Path) -> None:
    (tmp_path / "consts.py").write_text("LONG_S = 2.0\n")
    (tmp_path / "test_x.py").write_text(
        "import asyncio, time\n"
        "STEP_MS = 200\n"
        "WAIT = STEP_MS / 1000 * 3\n"
        "def f(pause: float, rng) -> None:\n"
        "    time.sleep(0.5)\n"              # counted: a literal at the bar
        "    time.sleep(0.2)\n"              # short
        "    time.sleep(WAIT)\n"             # counted: 0.6 from constants
        "    time.sleep(pause)\n"            # known at run time only
        "    time.sleep(max(0.0, pause))\n"  # known at run time only
        "    time.sleep(rng.uniform(0.6, 1.6))\n"  # counted at its lower bound
        "async def g() -> None:\n"
        "    await asyncio.sleep(3 * STEP_MS / 1000)\n")  # counted: 0.6
    found = sleeps(tmp_path)
    assert [s.seconds for s in found] == [0.5, 0.2, pytest.approx(0.6), None, None, 0.6,
                                          pytest.approx(0.6)]
    assert len(long_fixed_sleeps(root=tmp_path)) == 4


def test_quiet_for_passes_a_steady_value_and_fails_at_the_first_change() -> None:
    assert quiet_for(lambda: 7, 0.1, every=0.01) == 7
    reads = [0]

    def fetch() -> int:
        reads[0] += 1
        return reads[0] // 3  # 0, 0, then 1 on the third read

    with pytest.raises(AssertionError, match=r"deliveries changed within 5.0s: 0 -> 1"):
        quiet_for(fetch, 5.0, "deliveries", every=0.001)
    assert reads[0] == 3  # failed at the change, not at the window's end


async def test_quiet_for_async_fails_at_the_first_change() -> None:
    seen = [0]

    def fetch() -> int:
        seen[0] += 1
        return seen[0] // 3  # changes on the third read

    with pytest.raises(AssertionError, match="changed"):
        await quiet_for_async(fetch, 5.0, every=0.001)
    assert seen[0] == 3
    assert await quiet_for_async(lambda: "same", 0.05) == "same"
