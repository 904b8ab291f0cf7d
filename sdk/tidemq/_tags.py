"""``TagExpression``: ``*`` (every message) or ``tagA || tagB`` (any of those tags).

The protocol's expression (``tidemq.protocol.tags``: one parser for the SDK and the broker), with
the SDK's error: a subscription the broker would refuse raises ``ConfigurationError`` here. The
broker filters by tag hash, so a hash collision can let a foreign tag through; consumers confirm
each message with ``matches``.
"""

from __future__ import annotations

from typing import Self

from tidemq import protocol
from tidemq._exceptions import ConfigurationError
from tidemq.protocol.tags import TagExpression as _Expression


class TagExpression(_Expression):
    """A parsed tag expression; ``tags`` is None for ``*``."""

    __slots__ = ()

    @classmethod
    def parse(cls, expression: str | None, where: str = "subscription") -> Self:
        """Parse ``*``, ``""``/None (both: every message) or ``a || b || c``."""
        try:
            return super().parse(expression, where)
        except protocol.ProtocolError as exc:
            raise ConfigurationError(exc.message) from None
