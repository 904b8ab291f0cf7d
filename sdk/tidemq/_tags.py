"""Tag expressions: ``*`` (every message) or ``tagA || tagB`` (any of those tags).

The broker filters by tag hash, so a hash collision can let a foreign tag through; consumers
confirm each message here. As in RocketMQ, a message without a tag matches only ``*``.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidemq._exceptions import ConfigurationError
from tidemq.protocol import ProtocolError
from tidemq.protocol.tags import parse_tag_expression

ALL = "*"


@dataclass(frozen=True, slots=True)
class TagExpression:
    """A parsed tag expression; ``tags`` is None for ``*``."""

    tags: frozenset[str] | None

    @classmethod
    def parse(cls, expression: str | None) -> TagExpression:
        """Parse ``*``, ``""``/None (both: every message) or ``a || b || c``; the broker's
        rule (tidemq.protocol.tags), so a subscription it would refuse fails here."""
        try:
            return cls(parse_tag_expression(expression, "subscription"))
        except ProtocolError as exc:
            raise ConfigurationError(exc.message) from None

    @property
    def matches_all(self) -> bool:
        return self.tags is None

    def matches(self, tag: str | None) -> bool:
        if self.tags is None:
            return True
        return tag is not None and tag in self.tags

    def __str__(self) -> str:
        """The normalized wire form: ``*`` or sorted tags joined by `` || ``."""
        return ALL if self.tags is None else " || ".join(sorted(self.tags))
