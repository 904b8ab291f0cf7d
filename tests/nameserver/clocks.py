"""Fake clocks for BrokerRegistry: the wall clock (calling the object) that stamps heartbeats
and the monotonic clock (``monotonic``) that decides liveness; ``advance`` moves both as real
time does, ``step_wall`` moves the wall clock alone as NTP or a resumed VM does."""

from __future__ import annotations


class FakeClock:
    def __init__(self, now_ms: int = 1_700_000_000_000, monotonic_ms: int = 5_000) -> None:
        self.now_ms = now_ms
        self.monotonic_ms = monotonic_ms

    def __call__(self) -> int:
        return self.now_ms

    def monotonic(self) -> int:
        return self.monotonic_ms

    def advance(self, seconds: float) -> None:
        self.now_ms += int(seconds * 1000)
        self.monotonic_ms += int(seconds * 1000)

    def step_wall(self, seconds: float) -> None:
        self.now_ms += int(seconds * 1000)
