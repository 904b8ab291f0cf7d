"""Long polling: hold a pull (or receive) until a message reaches one of its queues.

The store calls ``notify`` (registered with ``store.add_listener(hold.notify)``) after every
dispatched batch with the (topic, queue id) pairs that got messages. A waiter is a future
registered under each of its keys; ``notify`` resolves the futures under the keys it is given, so
a notify costs one dict lookup per key when nobody waits and a waiter wakes on the next loop turn.

Race-free use: a caller that awaits anything between checking for messages and waiting opens a
``watch`` first (it records a notify from then on) and waits on it after the check. A caller
that checks synchronously (``store.get``) and then calls ``wait`` straight away needs no watch:
notifies run on the same event loop, so none can slip in between.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

Key = tuple[str, int]  # (topic, queue id)


class Watch:
    """Interest in some keys from now on; ``wait`` returns at once if one was notified since."""

    __slots__ = ("_closed", "_future", "_hold", "_keys")

    def __init__(self, hold: PullHold, keys: Iterable[Key]) -> None:
        self._hold = hold
        self._keys = tuple(dict.fromkeys(keys))
        self._future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._closed = False
        if hold.closed:
            self._future.set_result(False)
        else:
            hold._register(self._keys, self._future)

    @property
    def fired(self) -> bool:
        return self._future.done()

    async def wait(self, timeout_s: float) -> bool:
        """True once a watched key is notified, False on timeout or shutdown."""
        if self._future.done():
            return self._future.result()
        if timeout_s <= 0:
            return False
        loop = asyncio.get_running_loop()
        timer = loop.call_later(timeout_s, _resolve, self._future, False)
        try:
            return await self._future
        finally:
            timer.cancel()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._hold._unregister(self._keys, self._future)
            if not self._future.done():
                self._future.cancel()

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PullHold:
    """Waiters per (topic, queue id), woken by the store's dispatch notifications."""

    def __init__(self) -> None:
        self._waiters: dict[Key, set[asyncio.Future[bool]]] = {}
        self.closed = False  # after wake_all: every wait returns at once
        self.notified = 0  # waiters woken by notify (metrics)

    def watch(self, keys: Iterable[Key]) -> Watch:
        """Start recording notifies for ``keys``; use as a context manager (it unregisters)."""
        return Watch(self, keys)

    async def wait(self, keys: list[Key], timeout_s: float) -> bool:
        """Wait until any of ``keys`` is notified (True) or ``timeout_s`` passes (False)."""
        if timeout_s <= 0 or self.closed:
            return False
        with Watch(self, keys) as watch:
            return await watch.wait(timeout_s)

    def notify(self, keys: set[Key] | Iterable[Key]) -> None:
        """Wake everyone waiting on any of ``keys`` (the store's dispatch listener)."""
        waiters = self._waiters
        if not waiters:
            return
        for key in keys:
            futures = waiters.pop(key, None)
            if futures:
                for future in futures:
                    if not future.done():
                        future.set_result(True)
                        self.notified += 1

    def wake_all(self) -> None:
        """Shutdown: release every waiter (they return False) and refuse to hold new ones."""
        self.closed = True
        waiters, self._waiters = self._waiters, {}
        for futures in waiters.values():
            for future in futures:
                _resolve(future, False)

    def reopen(self) -> None:
        self.closed = False

    def waiter_count(self) -> int:
        """Distinct waiters currently held (tests check nothing leaks)."""
        return len({id(f) for futures in self._waiters.values() for f in futures})

    @property
    def keys_held(self) -> int:
        return len(self._waiters)

    def _register(self, keys: tuple[Key, ...], future: asyncio.Future[bool]) -> None:
        for key in keys:
            self._waiters.setdefault(key, set()).add(future)

    def _unregister(self, keys: tuple[Key, ...], future: asyncio.Future[bool]) -> None:
        for key in keys:
            futures = self._waiters.get(key)
            if futures is not None:
                futures.discard(future)
                if not futures:
                    del self._waiters[key]


def _resolve(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)
