"""A lean HTTP/1.1 keep-alive GET client for a replica's fetch loop.

A replica caught up with its primary fetches once per group commit of the primary: thousands
of small requests a second on one connection, one at a time. Through httpx's layers (client,
auth flow, connection pool, h11, anyio) a replica spent 7.8-8.3 µs of CPU per replicated
message in a sustained R=3 async run, through this client 3.6-4.1. It writes the request line
and headers itself and reads the answer with asyncio streams: one connection per primary, kept
alive, reopened after any failure (``TIDEMQ_BROKER_REPLICA_FETCH_CLIENT=httpx`` goes back).

It speaks just what the primary's uvicorn answers: ``content-length`` or chunked bodies,
``connection: close``. TLS uses the process's verifying client context (``common/tls.py``), as
httpx does; with a service account (ACL on) every request is signed like ``SigningAuth``.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from urllib.parse import urlencode, urlsplit

from tidemq_server.common.auth.client import SigningAuth

MAX_HEAD_BYTES = 64 * 1024  # status line and headers of one answer at most (B)
CRLF = b"\r\n"


class FetchAnswer:
    """The parts of an ``httpx.Response`` the follower reads."""

    __slots__ = ("content", "headers", "status_code")

    def __init__(self, status_code: int, headers: dict[str, str], content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers  # names in lower case
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


class LeanClient:
    """GETs to one origin at a time over a kept-alive connection (not for concurrent use)."""

    def __init__(self, headers: Mapping[str, str], timeout_s: float,
                 ssl_context: ssl.SSLContext, auth: SigningAuth | None) -> None:
        self.headers = dict(headers)
        self.timeout_s = timeout_s  # a whole request: connect, send, the answer's last byte
        self.ssl_context = ssl_context
        self.auth = auth
        self._origin: tuple[str, str, int] | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def get(self, url: str, params: Mapping[str, str | int] | None = None,
                  headers: Mapping[str, str] | None = None) -> FetchAnswer:
        parts = urlsplit(url)
        tls = parts.scheme == "https"
        host = parts.hostname or ""
        origin = (parts.scheme, host, parts.port or (443 if tls else 80))
        path = parts.path or "/"
        query = urlencode(params) if params else parts.query
        fields = {"host": parts.netloc, **self.headers, **(headers or {})}
        if self.auth is not None:
            fields.update(self.auth.sign("GET", path, query, b""))
        head = "".join(f"{k}: {v}\r\n" for k, v in fields.items())
        request = f"GET {path}{'?' + query if query else ''} HTTP/1.1\r\n{head}\r\n".encode(
            "latin-1")
        async with asyncio.timeout(self.timeout_s):
            reused = self._writer is not None and self._origin == origin
            try:
                return await self._exchange(origin, tls, request)
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                self._drop()
                # a kept-alive connection the primary closed while idle: once more, afresh
                if not reused or (isinstance(exc, asyncio.IncompleteReadError) and exc.partial):
                    raise
            except BaseException:
                self._drop()
                raise
            try:
                return await self._exchange(origin, tls, request)
            except BaseException:
                self._drop()
                raise

    async def _exchange(self, origin: tuple[str, str, int], tls: bool, request: bytes
                        ) -> FetchAnswer:
        if self._writer is None or self._origin != origin:
            self._drop()
            self._reader, self._writer = await asyncio.open_connection(
                origin[1], origin[2], ssl=self.ssl_context if tls else None,
                limit=MAX_HEAD_BYTES)
            self._origin = origin
        reader, writer = self._reader, self._writer
        assert reader is not None
        writer.write(request)
        raw = await reader.readuntil(CRLF + CRLF)
        lines = raw[:-4].decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        if not version.startswith("HTTP/1."):
            raise ConnectionError(f"not an HTTP/1.1 answer: {lines[0][:80]!r}")
        status = int(rest[:3])
        fields: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        if "content-length" in fields:
            body = await reader.readexactly(int(fields["content-length"]))
        elif fields.get("transfer-encoding", "").lower() == "chunked":
            body = await _read_chunked(reader)
        else:  # the body runs to the connection's end
            body = await reader.read()
            fields["connection"] = "close"
        if fields.get("connection", "").lower() == "close":
            self._drop()
        return FetchAnswer(status, fields, body)

    def _drop(self) -> None:
        writer, self._writer, self._reader, self._origin = self._writer, None, None, None
        if writer is not None:
            writer.close()

    async def aclose(self) -> None:
        writer = self._writer
        self._drop()
        if writer is not None:
            try:
                await writer.wait_closed()
            except (ConnectionError, ssl.SSLError):
                pass


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size = int((await reader.readuntil(CRLF)).split(b";", 1)[0], 16)
        if size == 0:
            while await reader.readuntil(CRLF) != CRLF:  # trailers
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)
