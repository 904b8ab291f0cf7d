"""Tags and tag expressions: what a message may carry and what a subscription may ask for.

An expression is ``*`` (or empty: every message) or tags joined by ``||`` (``TagA || TagB``),
each trimmed. So a message tag that no expression could select is refused when it is sent:
``*``, one holding ``|``, or one with spaces around it.
"""

from __future__ import annotations

import re

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


def parse_tag_expression(expression: str | None, where: str = "tags") -> frozenset[str] | None:
    """``*``/empty/None → None (every tag); ``a || b`` → {"a", "b"}. BAD_REQUEST naming
    ``where`` and the expression when a part is empty or not a tag."""
    text = (expression or "").strip()
    if text in ("", ALL_TAGS):
        return None
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
    if ALL_TAGS in tags:
        return None
    return frozenset(tags)
