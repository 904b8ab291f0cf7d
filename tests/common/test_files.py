"""tidemq_server.common.files: atomic replacement and the pool of open file descriptors."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tidemq_server.common.files import FdPool, write_atomic


def test_write_atomic_replaces_whole_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "state.json"
    write_atomic(target, "one\n")
    write_atomic(target, b"two\n")
    assert target.read_bytes() == b"two\n"
    assert [p.name for p in target.parent.iterdir()] == ["state.json"]


def test_write_atomic_ignores_a_stale_temp_file(tmp_path: Path) -> None:
    """A temp file left by a crash mid-write is overwritten, never read as the file."""
    target = tmp_path / "cp"
    write_atomic(target, b"old")
    (tmp_path / "cp.tmp").write_bytes(b"torn garbage, longer than what follows")
    write_atomic(target, b"new")
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cp"]


def test_write_atomic_large_payload(tmp_path: Path) -> None:
    data = os.urandom(3 * 1024 * 1024 + 7)
    write_atomic(tmp_path / "big", data)
    assert (tmp_path / "big").read_bytes() == data


def _pool(tmp_path: Path, max_open: int | None = None,
          on_evict: Callable[[int], None] | None = None) -> FdPool:
    return FdPool(lambda key: tmp_path / f"{key:04d}", max_open=max_open, on_evict=on_evict)


def test_pool_opens_on_demand_and_removes(tmp_path: Path) -> None:
    pool = _pool(tmp_path)
    fd = pool.open(1)
    assert pool.open(1) == fd and pool.get(1) == fd and pool[1] == fd
    os.pwrite(fd, b"abc", 0)
    assert (tmp_path / "0001").read_bytes() == b"abc"
    assert pool.get(2) is None and 2 not in pool and list(pool) == [1]
    pool.remove(1)
    assert not (tmp_path / "0001").exists() and len(pool) == 0
    with pytest.raises(OSError):
        os.fstat(fd)  # closed


def test_pool_flags_without_create_refuse_a_missing_file(tmp_path: Path) -> None:
    pool = _pool(tmp_path)
    with pytest.raises(FileNotFoundError):
        pool.open(5, os.O_RDWR)
    assert 5 not in pool
    pool.open(5, os.O_RDWR | os.O_CREAT | os.O_EXCL)
    pool.close_all()
    with pytest.raises(FileExistsError):
        pool.open(5, os.O_RDWR | os.O_CREAT | os.O_EXCL)


def test_pool_evicts_least_recently_used(tmp_path: Path) -> None:
    evicted: list[int] = []
    pool = _pool(tmp_path, max_open=2, on_evict=evicted.append)
    first = pool.open(1)
    pool.open(2)
    pool.open(1)  # 1 is now the most recently used
    pool.open(3)
    assert evicted == [2] and sorted(pool) == [1, 3]
    assert pool.get(1) == first  # kept open, same descriptor
    pool.get(1)  # a peek does not refresh: 1 stays older than 3
    pool.open(4)
    assert evicted == [2, 1] and sorted(pool) == [3, 4]
    os.pwrite(pool.open(2), b"again", 0)  # reopened after eviction: same file
    assert (tmp_path / "0002").read_bytes() == b"again"
    pool.close_all()
    assert len(pool) == 0
