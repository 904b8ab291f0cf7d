"""The SDK's tracing hook: ``tracer`` is None unless ``tidemq.otel`` is switched on.

Public methods (``Producer.send`` ...) are wrapped by ``TidemqInstrumentor`` itself; the three
steps without a public method of their own call the hook here:

- a push consumer running its handler on a message (``process``),
- a transactional producer answering a check-back (``check``),
- a push consumer handing a failed message to the group's retry topic (``settle``).

Each site reads the module attribute once per message (``if _hooks.tracer is not None``), so
with tracing off nothing else runs. This module imports nothing of OpenTelemetry.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from tidemq.protocol import ReceivedMessage


class Tracer(Protocol):
    def process(self, handler: Callable[[ReceivedMessage], Awaitable[Any]],
                message: ReceivedMessage, group: str, clustering: bool) -> Awaitable[Any]:
        """Run ``handler(message)`` inside a "process" span; its result."""

    def check(self, check: Callable[[ReceivedMessage], Awaitable[Any]],
              message: ReceivedMessage, group: str) -> Awaitable[Any]:
        """Run a check-back ``check(message)`` inside a "check" span; its answer."""

    def settle(self, call: Awaitable[str], message: ReceivedMessage, group: str,
               action: str) -> Awaitable[str]:
        """Await ``call`` (a settlement of ``message``: ``action``) inside a "settle" span."""


#: Set by ``tidemq.otel.TidemqInstrumentor().instrument()``, cleared by ``uninstrument()``.
tracer: Tracer | None = None
