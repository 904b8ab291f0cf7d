"""A TCP relay in front of a service that a test can cut and heal: the one link it stands for
breaks (as a partition does) while the service, and every other link to it, keeps working.

Connections are relayed byte for byte by threads of the test process. ``cut()`` closes the
connections being relayed and from then on accepts new ones without ever answering them (a
black hole, as a cut cable: clients wait for their own timeouts); ``heal()`` relays again.
Needs no privileges, unlike network namespaces (bench/_faults/netns.py).
"""

from __future__ import annotations

import contextlib
import socket
import threading

HOST = "127.0.0.1"
CHUNK = 64 * 1024  # bytes relayed per read


class Relay:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._server = socket.create_server((HOST, 0))
        self.port: int = self._server.getsockname()[1]
        self._lock = threading.Lock()
        self._cut = False
        self._closed = False
        self._live: set[socket.socket] = set()  # both ends of relayed connections
        self._held: list[socket.socket] = []  # connections accepted while cut
        self.relayed = 0  # connections relayed so far
        self._thread = threading.Thread(target=self._accept, name=f"relay-{self.port}",
                                        daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            live, self._live = self._live, set()
        for s in live:
            _close(s)

    def heal(self) -> None:
        with self._lock:
            self._cut = False
            held, self._held = self._held, []
        for s in held:
            _close(s)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            live = [*self._live, *self._held]
            self._live, self._held = set(), []
        _close(self._server)
        for s in live:
            _close(s)
        self._thread.join(5)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._closed:
                    _close(conn)
                    return
                if self._cut:
                    self._held.append(conn)
                    continue
            try:
                upstream = socket.create_connection((HOST, self.target_port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                _close(conn)
                continue
            with self._lock:
                self._live.update((conn, upstream))
                self.relayed += 1
            for src, dst in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(CHUNK):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._live.discard(src)
                self._live.discard(dst)
            _close(src)
            _close(dst)


def _close(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        s.close()
