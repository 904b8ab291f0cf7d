"""How the SDK retries: ``RetryPolicy`` (one deadline per call, exponential back-off capped at
about a second, jitter, ``Retry-After``) and ``gave_up``, which makes the error that finally
reaches the application say how many attempts over how long and why it stopped.

Every retry loop of the SDK uses these: ``HttpClient`` (one request), ``SendAttempts``
(``_fault``: one send across broker groups), ``Client._retry_call`` (a call that is not a send),
route lookups (``_routes``). Defaults are in ``_constants`` (``RETRY_*``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tidemq._constants import (
    RETRY_DEADLINE_S,
    RETRY_INITIAL_BACKOFF_S,
    RETRY_MAX_BACKOFF_S,
    RETRY_MAX_RETRY_AFTER_S,
)
from tidemq._exceptions import ConfigurationError, TidemqError


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How retriable failures are retried: until ``deadline_s`` after the call began.

    By default (``max_attempts=None``) as many attempts as fit in the deadline are made, so a
    broker restart or a primary election (seconds) never reaches the application; a number
    bounds the attempts too (``max_attempts=1`` disables retries). ``deadline_s=None`` with
    ``max_attempts=None`` retries for ever. Between attempts the pause doubles from
    ``initial_backoff_s`` up to ``max_backoff_s``, the ``jitter`` fraction of it drawn at random
    (so clients that failed together do not come back together), and is at least the server's
    ``Retry-After`` (up to ``max_retry_after_s``). The deadline bounds when an attempt may
    *start*: the last one may still take up to the request timeout.
    """

    max_attempts: int | None = None  # attempts in all, the first included; None: the deadline's
    initial_backoff_s: float = RETRY_INITIAL_BACKOFF_S  # pause after the first failure (s)
    max_backoff_s: float = RETRY_MAX_BACKOFF_S  # cap of the exponential pause (s)
    multiplier: float = 2.0  # growth of the pause per attempt
    jitter: float = 0.5  # fraction of each pause drawn at random (0: none, 1: full jitter)
    max_retry_after_s: float = RETRY_MAX_RETRY_AFTER_S  # cap of a server's Retry-After (s)
    deadline_s: float | None = RETRY_DEADLINE_S  # no attempt starts later than this (s)

    def __post_init__(self) -> None:
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ConfigurationError(f"RetryPolicy: max_attempts must be >= 1 or None, "
                                     f"got {self.max_attempts}")
        if not 0.0 <= self.jitter <= 1.0:
            raise ConfigurationError(f"RetryPolicy: jitter must be within 0..1, "
                                     f"got {self.jitter}")
        if self.deadline_s is not None and self.deadline_s < 0:
            raise ConfigurationError(f"RetryPolicy: deadline_s must be >= 0 or None, "
                                     f"got {self.deadline_s}")
        if self.initial_backoff_s < 0 or self.max_backoff_s < 0 or self.multiplier < 1:
            raise ConfigurationError(
                f"RetryPolicy: initial_backoff_s and max_backoff_s must be >= 0 and multiplier "
                f">= 1, got {self.initial_backoff_s}, {self.max_backoff_s}, {self.multiplier}")

    def backoff_s(self, attempt: int, retry_after: float | None = None) -> float:
        """The pause after failed attempt number ``attempt`` (1-based)."""
        growth = self.multiplier ** min(attempt - 1, 64)  # no float overflow, however many
        base = min(self.max_backoff_s, self.initial_backoff_s * growth)
        pause = base * (1.0 - self.jitter) + random.uniform(0.0, base * self.jitter)
        if retry_after is not None:
            pause = max(pause, min(retry_after, self.max_retry_after_s))
        return pause

    def exhausted(self, attempts: int, elapsed_s: float, pause_s: float) -> str | None:
        """Why to give up after ``attempts`` failed attempts ``elapsed_s`` into the call, the
        next one due after ``pause_s``; None: try again."""
        if self.max_attempts is not None and attempts >= self.max_attempts:
            return f"max_attempts={self.max_attempts}"
        if self.deadline_s is not None and elapsed_s + pause_s > self.deadline_s:
            return f"retry deadline {self.deadline_s:g}s"
        return None


def gave_up(exc: TidemqError, attempts: int, elapsed_s: float, why: str | None = None,
            ) -> TidemqError:
    """``exc``, the last failure of a call that made ``attempts`` attempts over ``elapsed_s``,
    with that said in its message (and in its ``attempts`` / ``elapsed_s`` attributes), so the
    application sees how long the SDK tried and the last cause. Said once: an error already
    annotated by an inner retry loop is left as it is."""
    if exc.attempts > 1 or attempts <= 1:
        return exc
    exc.attempts = attempts
    exc.elapsed_s = elapsed_s
    reason = f"; gave up: {why}" if why else "; not retriable" if not exc.retriable else ""
    if exc.args:
        exc.args = (f"{exc.args[0]} (after {attempts} attempts in {elapsed_s:.1f}s{reason})",
                    *exc.args[1:])
    return exc


def pause_after(policy: RetryPolicy, exc: TidemqError, attempts: int, elapsed_s: float) -> float:
    """The pause before the next attempt of a call whose attempt number ``attempts`` failed
    with ``exc`` ``elapsed_s`` into it; a failure that is not retriable, or a policy that is
    exhausted, is raised instead, annotated by ``gave_up``."""
    if not exc.retriable:
        raise gave_up(exc, attempts, elapsed_s)
    pause = policy.backoff_s(attempts, getattr(exc, "retry_after", None))
    why = policy.exhausted(attempts, elapsed_s, pause)
    if why is not None:
        raise gave_up(exc, attempts, elapsed_s, why)
    return pause


NO_RETRY = RetryPolicy(max_attempts=1)
DEFAULT_RETRY = RetryPolicy()
