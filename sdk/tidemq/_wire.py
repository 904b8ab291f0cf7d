"""A small HTTP/1.1 keep-alive client on an asyncio protocol: the SDK's default transport.

Why: the SDK's calls are small requests to a handful of brokers. httpx/httpcore spend most of a
request's client CPU on generality this traffic does not use (anyio cancel scopes, per-request
trace objects, and a pool that re-checks every pooled connection on each request); measured side
by side on the SDK's hot calls (bench/http_client.py) this transport costs a fraction of that.

What it does, and no more:
- HTTP/1.1 only, one request at a time per connection; answers framed by ``content-length``,
  ``transfer-encoding: chunked`` or the connection's end. ``http://`` and ``https://`` (TLS with
  the context the caller hands in: ``_http.shared_ssl_context``, the SDK's one TLS context).
- A pool of idle keep-alive connections per origin (host, port, scheme), at most ``max_idle``
  each; at most ``max_connections`` requests in flight over all origins (the rest wait).
- An idle connection the server has closed is noticed before reuse (its reader saw EOF). One
  the server closes just as a request goes out on it (the end, before any byte of an answer:
  what the server's idle timeout looks like) is retried once on a new connection; what a
  request may do twice is what it may do on any retry of the SDK's (sends carry their message
  id, so the broker stores them once).
- Errors: ``WireConnectError`` (nothing was sent), ``WireError`` (sent, the answer was lost),
  ``TimeoutError`` from the caller's deadline (``sent`` tells which side of it).
- A connection is an ``asyncio.Protocol`` that keeps what arrives as a list of chunks and joins
  them once per answer. (``asyncio.StreamReader`` grows one bytearray, copies the body out of it
  and pauses and resumes the socket around its 64 KiB limit: measured on a 2 MB pull answer, 3-4
  ms of client CPU instead of 1, and about twice the wall time.)
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Callable, Mapping
from typing import cast
from urllib.parse import urlencode

from tidemq._exceptions import WireConnectError, WireError, WireTimeout
from tidemq._transport import Params, TransportResponse

_HEAD_LIMIT = 64 * 1024  # bytes of status line + headers at most
_NO_BODY = frozenset((204, 304))


class _Closed(Exception):
    """The connection ended before an answer's first byte (a stale keep-alive connection)."""


Origin = tuple[str, str, int]  # scheme, host, port


class _Conn(asyncio.Protocol):
    """One connection: what it received, waiting to be read (see module doc)."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._chunks: list[bytes] = []
        self._size = 0
        self._eof = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._error = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- the client's side ---------------------------------------------------------------------

    def usable(self) -> bool:
        return not self._eof and self._transport is not None \
            and not self._transport.is_closing()

    def write(self, data: bytes) -> None:
        assert self._transport is not None
        self._transport.write(data)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    async def _more(self, expected: int | None) -> None:
        """Wait for more bytes; at the end of the connection, say how the read fell short."""
        if self._eof:
            if self._error is not None:
                raise self._error
            raise asyncio.IncompleteReadError(self._joined(), expected)
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _joined(self) -> bytes:
        data = b"".join(self._chunks)
        self._chunks = [data] if data else []
        return data

    def _take(self, n: int) -> bytes:
        first = self._chunks[0]
        if len(first) == n:
            self._chunks.pop(0)
        elif len(first) > n:
            self._chunks[0] = first[n:]
            first = first[:n]
        else:
            data = self._joined()
            first, rest = data[:n], data[n:]
            self._chunks = [rest] if rest else []
        self._size -= n
        return first

    async def read_until(self, separator: bytes, limit: int) -> bytes:
        """Up to and including ``separator``, which must come within ``limit`` bytes."""
        searched = 0
        while True:
            data = self._joined()
            at = data.find(separator, searched)
            if at >= 0:
                return self._take(at + len(separator))
            if len(data) > limit:
                raise ValueError(f"no {separator!r} within {limit} bytes")
            searched = max(0, len(data) - len(separator) + 1)
            await self._more(None)

    async def read_exactly(self, n: int) -> bytes:
        while self._size < n:
            await self._more(n)
        return self._take(n) if n else b""

    async def read_to_end(self) -> bytes:
        while not self._eof:
            await self._more(None)
        if self._error is not None:
            raise self._error
        return self._take(self._size) if self._size else b""


def split_url(url: str) -> tuple[Origin, str, str]:
    """``(origin, host header, request target)`` of an absolute http(s) URL."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("http", "https"):
        raise ValueError(f"not an http(s) URL: {url!r}")
    slash = rest.find("/")
    netloc, target = (rest, "/") if slash < 0 else (rest[:slash], rest[slash:])
    host, port = netloc, 443 if scheme == "https" else 80
    if netloc.startswith("["):  # [v6]:port
        end = netloc.find("]")
        host = netloc[1:end]
        if netloc[end + 1:end + 2] == ":":
            port = int(netloc[end + 2:])
    elif ":" in netloc:
        host, _, text = netloc.rpartition(":")
        port = int(text)
    return (scheme, host, port), netloc, target


class WireTransport:
    """Keep-alive HTTP/1.1 requests (see module doc); one per SDK client."""

    def __init__(self, *, max_connections: int, max_idle: int,
                 ssl_context: Callable[[], ssl.SSLContext]) -> None:
        self._slots = asyncio.Semaphore(max_connections)
        self._max_idle = max_idle
        self._ssl_context = ssl_context
        self._idle: dict[Origin, deque[_Conn]] = {}
        self._busy: set[_Conn] = set()
        self._closed = False

    async def request(self, method: str, url: str, *, headers: Mapping[str, str],
                      content: bytes | None, params: Params | None,
                      timeout_s: float) -> TransportResponse:
        """Send one request and read its answer within ``timeout_s``."""
        origin, netloc, target = split_url(url)
        if params:
            target += ("&" if "?" in target else "?") + urlencode(params)
        lines = [f"{method} {target} HTTP/1.1\r\nhost: {netloc}\r\n"]
        lines.extend(f"{k}: {v}\r\n" for k, v in headers.items())
        if content is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"content-length: {len(content or b'')}\r\n")
        lines.append("\r\n")
        data = "".join(lines).encode("latin-1") + (content or b"")
        sent = False
        try:
            async with asyncio.timeout(timeout_s):
                await self._slots.acquire()
                try:
                    conn = self._take(origin)
                    closed_on_us = False  # a kept connection ended without an answer
                    if conn is not None:
                        try:
                            sent = True
                            return await self._exchange(conn, origin, method, data)
                        except _Closed:
                            # stale (the server closed it before reading this request), or the
                            # server died after reading it: a new connection tells them apart
                            closed_on_us = True
                    sent = False
                    try:
                        conn = await self._open(origin)
                    except WireConnectError as exc:
                        if not closed_on_us:
                            raise
                        # no server any more: it may have processed the request before it died
                        raise WireError("the server closed the connection without an answer "
                                        "and accepts none now: the request may have been "
                                        "processed") from exc
                    sent = True
                    try:
                        return await self._exchange(conn, origin, method, data)
                    except _Closed as exc:
                        raise WireError("the server closed the connection without an answer") \
                            from exc
                finally:
                    self._slots.release()
        except TimeoutError as exc:
            if isinstance(exc, WireTimeout):
                raise
            raise WireTimeout(f"no answer within {timeout_s:.3g}s", sent=sent) from None

    def _take(self, origin: Origin) -> _Conn | None:
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()  # the most recently used: the least likely to be timed out
            if conn.usable():
                return conn
            conn.close()
        return None

    async def _open(self, origin: Origin) -> _Conn:
        if self._closed:
            raise WireConnectError("the transport is closed")
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        try:
            if scheme == "https":
                _, conn = await loop.create_connection(_Conn, host, port,
                                                       ssl=self._ssl_context(),
                                                       server_hostname=host)
            else:
                _, conn = await loop.create_connection(_Conn, host, port)
        except (OSError, ssl.SSLError) as exc:
            raise WireConnectError(f"cannot connect to {host}:{port}: {exc!r}") from exc
        return conn

    async def _exchange(self, conn: _Conn, origin: Origin, method: str,
                        data: bytes) -> TransportResponse:
        self._busy.add(conn)
        keep = False
        try:
            conn.write(data)
            response, keep = await self._read(conn, method)
            return response
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError, ValueError) as exc:
            raise WireError(f"connection failed during the request: {exc!r}") from exc
        finally:
            self._busy.discard(conn)
            if keep and not self._closed:
                idle = self._idle.setdefault(origin, deque())
                if len(idle) < self._max_idle:
                    idle.append(conn)
                else:
                    conn.close()
            else:
                conn.close()

    @staticmethod
    async def _read(conn: _Conn, method: str) -> tuple[TransportResponse, bool]:
        try:
            head = await conn.read_until(b"\r\n\r\n", _HEAD_LIMIT)
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                raise _Closed from exc
            raise
        status_line, *header_lines = head[:-4].decode("latin-1").split("\r\n")
        version, _, rest = status_line.partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise ValueError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
        status = int(code)
        headers: dict[str, str] = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        keep = headers.get("connection", "").lower() != "close" and version == "HTTP/1.1"
        if method == "HEAD" or status in _NO_BODY or status < 200:
            body = b""
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            body = await _read_chunked(conn)
        elif (length := headers.get("content-length")) is not None:
            body = await conn.read_exactly(int(length))
        else:
            body = await conn.read_to_end()  # framed by the connection's end
            keep = False
        return TransportResponse(status, reason, headers, body), keep

    async def aclose(self) -> None:
        self._closed = True
        conns = [c for idle in self._idle.values() for c in idle] + list(self._busy)
        self._idle.clear()
        for conn in conns:
            conn.close()


async def _read_chunked(conn: _Conn) -> bytes:
    parts: list[bytes] = []
    while True:
        size_line = await conn.read_until(b"\r\n", _HEAD_LIMIT)
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while (await conn.read_until(b"\r\n", _HEAD_LIMIT)) != b"\r\n":
                pass  # trailers
            return b"".join(parts)
        parts.append(await conn.read_exactly(size))
        await conn.read_exactly(2)
