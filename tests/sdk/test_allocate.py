from __future__ import annotations

import pytest
from tidemq import ConfigurationError, allocate_averagely, allocation_table

Q = [f"q{i}" for i in range(10)]


@pytest.mark.parametrize(
    ("members", "queues", "expected"),
    [
        (["a"], Q[:4], {"a": Q[:4]}),
        (["a", "b"], Q[:4], {"a": Q[:2], "b": Q[2:4]}),
        (["a", "b", "c"], Q, {"a": Q[0:4], "b": Q[4:7], "c": Q[7:10]}),
        (["a", "b", "c", "d"], Q, {"a": Q[0:3], "b": Q[3:6], "c": Q[6:8], "d": Q[8:10]}),
        (["a", "b", "c"], Q[:2], {"a": [Q[0]], "b": [Q[1]], "c": []}),
        (["a", "b"], [], {"a": [], "b": []}),
    ],
)
def test_average_allocation_table(
    members: list[str], queues: list[str], expected: dict[str, list[str]],
) -> None:
    assert allocation_table(members, queues) == expected


@pytest.mark.parametrize("n_members", range(1, 12))
@pytest.mark.parametrize("n_queues", [0, 1, 3, 8, 16, 17])
def test_every_queue_has_exactly_one_owner_and_shares_differ_by_at_most_one(
    n_members: int, n_queues: int,
) -> None:
    members = [f"c{i:02d}" for i in range(n_members)]
    queues = list(range(n_queues))
    table = allocation_table(members, queues)
    owned = [q for m in members for q in table[m]]
    assert sorted(owned) == queues
    sizes = [len(v) for v in table.values()]
    assert max(sizes) - min(sizes) <= 1


def test_unknown_member_is_an_error() -> None:
    with pytest.raises(ConfigurationError):
        allocate_averagely("x", ["a"], Q)
