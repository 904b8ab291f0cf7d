"""Files on disk shared by the services: atomic replacement and a pool of open descriptors."""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Make a file's creation, rename or removal in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes | str) -> None:
    """Replace ``path`` with ``data`` durably: a temp file beside it is written and fsynced,
    renamed over ``path``, then the directory is fsynced. A reader, or a restart after a crash,
    sees the old file or the new one, never a torn one. Blocking (run it in a thread when the
    event loop must not wait for the disk)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.with_name(f"{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(raw)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


class FdPool:
    """Open file descriptors keyed by an int (a segment's or a bucket's start), opened on demand.

    With ``max_open`` the pool closes its least recently opened-or-used descriptor before it
    opens one more, telling ``on_evict`` which key went (e.g. to fsync that file by path later).
    """

    def __init__(self, path_of: Callable[[int], Path], *, max_open: int | None = None,
                 on_evict: Callable[[int], None] | None = None) -> None:
        self.path_of = path_of
        self.max_open = max_open
        self.on_evict = on_evict
        self._fds: OrderedDict[int, int] = OrderedDict()

    def open(self, key: int, flags: int = os.O_RDWR | os.O_CREAT) -> int:
        """The descriptor of ``key``'s file, opened with ``flags`` (mode 0644) if not yet."""
        fd = self._fds.get(key)
        if fd is not None:
            if self.max_open is not None:
                self._fds.move_to_end(key)
            return fd
        if self.max_open is not None and len(self._fds) >= self.max_open:
            old, old_fd = self._fds.popitem(last=False)
            if self.on_evict is not None:
                self.on_evict(old)
            os.close(old_fd)
        fd = os.open(self.path_of(key), flags, 0o644)
        self._fds[key] = fd
        return fd

    def get(self, key: int) -> int | None:
        """The descriptor of ``key`` if it is open (its place in the LRU order unchanged)."""
        return self._fds.get(key)

    def __getitem__(self, key: int) -> int:
        return self._fds[key]

    def __contains__(self, key: object) -> bool:
        return key in self._fds

    def __iter__(self) -> Iterator[int]:
        return iter(self._fds)

    def __len__(self) -> int:
        return len(self._fds)

    def fds(self) -> list[int]:
        return list(self._fds.values())

    def close(self, key: int) -> int | None:
        """Close ``key``'s descriptor if it is open; the descriptor it was, else None."""
        fd = self._fds.pop(key, None)
        if fd is not None:
            os.close(fd)
        return fd

    def remove(self, key: int) -> None:
        """Close ``key``'s descriptor and delete its file."""
        self.close(key)
        self.path_of(key).unlink(missing_ok=True)

    def close_all(self) -> None:
        for fd in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()
