"""Tags and tag expressions: what a message may carry and what a subscription may ask for.

An expression is ``*`` (or empty: every message) or tags joined by ``||`` (``TagA || TagB``),
each trimmed; ``TagExpression.parse`` is the one parser of the SDK and every service. So a message
tag that no expression could select is refused when it is sent: ``*``, one holding ``|``, or one
with spaces around it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Self

from tidemq.protocol.codes import ErrorCode, ProtocolError

ALL_TAGS = "*"
TAG_MAX = 255  # characters of a tag
_BAD_TAG_CHARS = re.compile(r"[|\x00-\x1f\x7f]")


def tag_problem(tag: str) -> str | None:
    """Why no tag expression could select a message tagged ``tag`` (None: it is fine)."""
    if tag == ALL_TAGS:
        return "'*' means every tag in a subscription and cannot be a message's tag"
    if tag != tag.strip():
        return "must not start or end with spaces (subscriptions trim them)"
    bad = _BAD_TAG_CHARS.search(tag)
    if bad is not None:
        return (f"must not contain {bad.group()!r} ('||' separates tags in a subscription)"
                if bad.group() == "|" else "must not contain control characters")
    return None


@dataclass(frozen=True, slots=True)
class TagExpression:
    """A parsed tag expression: the one parser of ``*`` / ``a || b`` for the SDK and every
    service; ``tags`` is None for ``*`` (every message). As in RocketMQ, a message without a tag
    matches only ``*``."""

    tags: frozenset[str] | None

    @classmethod
    def parse(cls, expression: str | None, where: str = "tags") -> Self:
        """``*``/empty/None → every tag; ``a || b`` → {"a", "b"}. BAD_REQUEST naming ``where``
        and the expression when a part is empty or not a tag."""
        text = (expression or "").strip()
        if text in ("", ALL_TAGS):
            return cls(None)
        tags = [t.strip() for t in text.split("||")]
        for tag in tags:
            problem = ("is empty" if not tag else None if tag == ALL_TAGS
                       else f"{tag!r} {tag_problem(tag)}" if tag_problem(tag) else None)
            if len(tag) > TAG_MAX:
                problem = f"{tag[:20]!r}… is longer than {TAG_MAX} characters"
            if problem:
                raise ProtocolError(ErrorCode.BAD_REQUEST,
                                    f"{where}: tag expression {expression!r} is not '*' or "
                                    f"'TagA || TagB': a tag {problem}")
        return cls(None if ALL_TAGS in tags else frozenset(tags))

    @property
    def matches_all(self) -> bool:
        return self.tags is None

    def matches(self, tag: str | None) -> bool:
        """Whether a message tagged ``tag`` (None: no tag) is selected."""
        return self.tags is None or (tag is not None and tag in self.tags)

    def union(self, other: TagExpression) -> TagExpression:
        """The messages either expression selects (a group's members subscribing differently)."""
        if self.tags is None or other.tags is None:
            return EVERY_TAG
        return TagExpression(self.tags | other.tags)

    def __str__(self) -> str:
        """The normalized wire form: ``*`` or the sorted tags joined by `` || ``."""
        return ALL_TAGS if self.tags is None else " || ".join(sorted(self.tags))


EVERY_TAG = TagExpression(None)  # ``*``
