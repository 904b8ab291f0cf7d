"""The one tag expression parser (``tidemq.protocol.tags``) that the SDK and the broker share."""

from __future__ import annotations

import pytest
from tidemq.protocol import ErrorCode, ProtocolError
from tidemq.protocol.tags import EVERY_TAG, TagExpression


@pytest.mark.parametrize("text", ["*", "", None, "  *  ", "a || *"])
def test_every_tag(text: str | None) -> None:
    assert TagExpression.parse(text) == EVERY_TAG and EVERY_TAG.tags is None


def test_tags_are_trimmed_and_named_in_the_error() -> None:
    assert TagExpression.parse("a || b ||c").tags == {"a", "b", "c"}
    with pytest.raises(ProtocolError, match=r"subscriptions\['T'\]: .* a tag is empty") as info:
        TagExpression.parse("a || || b", "subscriptions['T']")
    assert info.value.code is ErrorCode.BAD_REQUEST
    with pytest.raises(ProtocolError, match="longer than 255"):
        TagExpression.parse("x" * 256)


def test_union_is_what_either_selects() -> None:
    a, b = TagExpression.parse("a"), TagExpression.parse("b || c")
    assert str(a.union(b)) == "a || b || c" and a.union(EVERY_TAG) == EVERY_TAG
    assert EVERY_TAG.union(a).matches(None) and not a.union(b).matches(None)
