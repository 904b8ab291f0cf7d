from __future__ import annotations

import pytest
from tidemq import ConfigurationError, TagExpression


@pytest.mark.parametrize("text", ["*", "", None, "  *  ", "a || *"])
def test_match_all(text: str | None) -> None:
    expr = TagExpression.parse(text)
    assert expr.matches_all and str(expr) == "*"
    assert expr.matches("anything") and expr.matches(None)


def test_or_expression() -> None:
    expr = TagExpression.parse(" tagB||tagA ||  tagC ")
    assert expr.tags == frozenset({"tagA", "tagB", "tagC"})
    assert str(expr) == "tagA || tagB || tagC"
    assert expr.matches("tagA") and expr.matches("tagC")
    assert not expr.matches("tagD") and not expr.matches(None) and not expr.matches("taga")


def test_single_tag_and_errors() -> None:
    assert TagExpression.parse("created").matches("created")
    with pytest.raises(ConfigurationError):
        TagExpression.parse("a || || b")
