"""The epoch history file and where two histories diverge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tidemq_server.broker.replication.epochs import (
    EpochEntry,
    EpochFile,
    divergence_point,
    end_of,
    parse_entries,
)


def entries(*pairs: tuple[int, int]) -> list[EpochEntry]:
    return [EpochEntry(e, s) for e, s in pairs]


def test_file_round_trips_through_an_atomic_rewrite(tmp_path: Path) -> None:
    f = EpochFile(tmp_path / "epochs.json")
    f.load()
    assert f.entries == [] and f.last_epoch == 0
    f.begin(1, 0)
    f.begin(3, 500)
    again = EpochFile(tmp_path / "epochs.json")
    again.load()
    assert again.entries == entries((1, 0), (3, 500)) and again.last_epoch == 3
    assert json.loads((tmp_path / "epochs.json").read_text()) == {"epochs": [[1, 0], [3, 500]]}
    assert not (tmp_path / "epochs.json.tmp").exists()


def test_begin_refuses_an_older_epoch_and_replaces_an_empty_last_term(tmp_path: Path) -> None:
    f = EpochFile(tmp_path / "e.json")
    f.begin(2, 100)
    with pytest.raises(ValueError, match="not newer"):
        f.begin(2, 200)
    f.begin(3, 100)  # epoch 2 wrote nothing: its entry gives way
    assert f.entries == entries((3, 100))
    with pytest.raises(ValueError, match="before"):
        f.begin(4, 50)


def test_truncate_and_adopt(tmp_path: Path) -> None:
    f = EpochFile(tmp_path / "e.json")
    f.begin(1, 0)
    f.begin(2, 300)
    f.truncate(299)
    assert f.entries == entries((1, 0))
    assert f.adopt(entries((1, 0), (2, 250), (4, 900)), upto=600)
    assert f.entries == entries((1, 0), (2, 250))
    assert not f.adopt(entries((1, 0), (2, 250)), upto=600)


def test_parse_rejects_malformed_and_unordered_histories() -> None:
    assert parse_entries([[1, 0], [2, 10]]) == entries((1, 0), (2, 10))
    for bad in ("x", [[1]], [[1, -1]], [[2, 0], [1, 10]], [[1, 10], [2, 5]]):
        with pytest.raises(ValueError):
            parse_entries(bad)


def test_end_of_an_epoch() -> None:
    h = entries((1, 0), (2, 300), (5, 700))
    assert end_of(h, 1, 1000) == 300
    assert end_of(h, 5, 1000) == 1000
    assert end_of(h, 3, 1000) is None


def test_divergence_same_history_keeps_the_shorter_end() -> None:
    h = entries((1, 0))
    assert divergence_point(h, 400, h, 900) == 400
    assert divergence_point(h, 900, h, 400) == 400


def test_divergence_former_primary_cut_back_to_the_new_term_start() -> None:
    # old primary wrote epoch 1 up to 1000; the replica promoted at 800 as epoch 2
    old = entries((1, 0))
    new = entries((1, 0), (2, 800))
    assert divergence_point(old, 1000, new, 1500) == 800


def test_divergence_with_an_unshared_newer_term_uses_the_last_common_one() -> None:
    # a deposed primary at epoch 2 (from 800) rejoins a group at epoch 3 started at 700
    mine = entries((1, 0), (2, 800))
    theirs = entries((1, 0), (3, 700))
    assert divergence_point(mine, 1200, theirs, 2000) == 700


def test_divergence_without_histories() -> None:
    assert divergence_point([], 500, [], 300) == 300
    assert divergence_point([], 500, entries((1, 0), (2, 400)), 900) == 400
    assert divergence_point(entries((7, 0)), 500, entries((1, 0)), 900) == 0
