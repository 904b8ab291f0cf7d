"""A small HTTP/1.1 keep-alive client over asyncio streams: the SDK's default transport.

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
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlencode

_HEAD_LIMIT = 64 * 1024  # bytes of status line + headers at most
_NO_BODY = frozenset((204, 304))


class WireError(Exception):
    """The request failed after it was (maybe) sent: the server may have processed it."""

    sent = True


class WireConnectError(WireError):
    """No connection could be opened: nothing was sent."""

    sent = False


class WireTimeout(TimeoutError):
    """The caller's deadline passed; ``sent`` says whether the request had gone out."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


@dataclass(slots=True)
class WireResponse:
    status: int
    reason: str
    headers: dict[str, str]  # names lower-cased; a repeated header keeps its last value
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


class _Closed(Exception):
    """The connection ended before an answer's first byte (a stale keep-alive connection)."""


Origin = tuple[str, str, int]  # scheme, host, port


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def usable(self) -> bool:
        return not self.reader.at_eof() and not self.writer.is_closing()

    def close(self) -> None:
        self.writer.close()


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
                      content: bytes | None, params: Mapping[str, str | int | float] | None,
                      timeout_s: float) -> WireResponse:
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
                    if conn is not None:
                        try:
                            sent = True
                            return await self._exchange(conn, origin, method, data)
                        except _Closed:
                            pass  # stale: the server closed it before reading this request
                    sent = False
                    conn = await self._open(origin)
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
        try:
            if scheme == "https":
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=self._ssl_context(), server_hostname=host,
                    limit=_HEAD_LIMIT)
            else:
                reader, writer = await asyncio.open_connection(host, port, limit=_HEAD_LIMIT)
        except (OSError, ssl.SSLError) as exc:
            raise WireConnectError(f"cannot connect to {host}:{port}: {exc!r}") from exc
        return _Conn(reader, writer)

    async def _exchange(self, conn: _Conn, origin: Origin, method: str,
                        data: bytes) -> WireResponse:
        self._busy.add(conn)
        keep = False
        try:
            conn.writer.write(data)
            response, keep = await self._read(conn.reader, method)
            return response
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ValueError) as exc:
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
    async def _read(reader: asyncio.StreamReader, method: str) -> tuple[WireResponse, bool]:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
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
            body = await _read_chunked(reader)
        elif (length := headers.get("content-length")) is not None:
            body = await reader.readexactly(int(length))
        else:
            body = await reader.read()  # framed by the connection's end
            keep = False
        return WireResponse(status, reason, headers, body), keep

    async def aclose(self) -> None:
        self._closed = True
        conns = [c for idle in self._idle.values() for c in idle] + list(self._busy)
        self._idle.clear()
        for conn in conns:
            conn.close()


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":
                pass  # trailers
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)
