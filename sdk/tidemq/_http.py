"""The SDK's only I/O seam: requests speaking docs/api.md, over our own keep-alive HTTP/1.1
transport (``_wire``) or, when one is handed in, an httpx transport.

- Bodies are msgpack (``application/msgpack``, bytes stay bytes) on the message hot paths and
  JSON elsewhere; answers are decoded by their content type.
- Error answers ``{code, message}`` become the matching ``ServerError`` subclass; httpx errors
  become ``TransportError`` — nothing foreign escapes.
- Retriable failures are retried with exponential back-off (capped at ``RETRY_MAX_BACKOFF_S``)
  and jitter, honouring ``Retry-After`` (503 BROKER_BUSY), until one deadline per call
  (``RETRY_DEADLINE_S``, 30 s): by default the number of attempts is not what gives up, so a
  broker restart or a primary election is ridden through. An error that finally reaches the
  caller says how many attempts over how long (``gave_up``). The policy is in ``_retry.py``.

A client carries its requests over one ``HttpTransport`` (``_transport.py``): the SDK's own
``WireTransport`` (the default, built here), ``MockTransport`` (in memory, for tests; it ships
with the SDK), or any object with its two methods. An ``httpx.AsyncBaseTransport`` (e.g.
``httpx.MockTransport``) is accepted too and goes through an ``httpx.AsyncClient``.

One place computes every request's headers (``request_headers``) and one builds the TLS context
(``shared_ssl_context``), whichever transport carries the request.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import os
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol
from urllib.parse import quote

import httpx

from tidemq._auth import Credentials, signer_for
from tidemq._constants import (
    HTTP_MAX_CONNECTIONS,
    HTTP_MAX_KEEPALIVE_CONNECTIONS,
    REQUEST_TIMEOUT_S,
    TLS_CA_ENV,
)
from tidemq._exceptions import (
    BadRequestError,
    ClientClosedError,
    ConfigurationError,
    RequestTimeoutError,
    ServerError,
    TidemqError,
    TransportError,
    UnexpectedResponseError,
    WireConnectError,
    WireError,
    WireTimeout,
    server_error,
)
from tidemq._retry import DEFAULT_RETRY, RetryPolicy, pause_after
from tidemq._retry import NO_RETRY as NO_RETRY  # re-exported: callers import it from here
from tidemq._retry import gave_up as gave_up  # re-exported likewise
from tidemq._transport import HttpTransport
from tidemq._wire import WireTransport
from tidemq.protocol import CONTENT_JSON, CONTENT_MSGPACK, ProtocolError
from tidemq.protocol.codec import decode_payload, encode_payload

#: What a client may be handed as its transport: ours (``HttpTransport``) or an httpx one.
Transport = HttpTransport | httpx.AsyncBaseTransport

log = logging.getLogger("tidemq.http")

Params = Mapping[str, str | int | float]


#: httpx errors raised before a connection existed: the request cannot have reached the server.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)



_ssl_context: ssl.SSLContext | None = None
_ca_file: str | None = None  # set by use_ca_bundle; None = the TIDEMQ_TLS_CA variable


def use_ca_bundle(path: str | None) -> None:
    """Verify https:// servers against the CA certificates in ``path`` (PEM) from now on,
    instead of ``TIDEMQ_TLS_CA`` or the default trust store; None goes back to those.
    Clients built before keep the context they were given."""
    global _ssl_context, _ca_file
    _ca_file = path
    _ssl_context = None


def shared_ssl_context() -> ssl.SSLContext:
    """One verifying TLS context for every client of this process, built on first use.

    It trusts the CA bundle named by ``use_ca_bundle`` or the ``TIDEMQ_TLS_CA`` variable (a
    PEM file: a private CA, e.g. the one ``tidemq up --tls`` makes) or else httpx's default
    store; hostnames are always checked. httpx builds a new context (loading the CA bundle,
    ~2 ms) for every client unless handed one, even when all its URLs are plain http://; the
    profile showed it at 2-10% of client samples, hence one per process.
    """
    global _ssl_context
    if _ssl_context is None:
        ca_file = _ca_file if _ca_file is not None else os.environ.get(TLS_CA_ENV, "")
        if ca_file:
            try:
                _ssl_context = ssl.create_default_context(cafile=ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigurationError(f"cannot load the CA bundle {ca_file!r} "
                                         f"({TLS_CA_ENV}): {exc}") from exc
        else:
            _ssl_context = httpx.create_ssl_context()
    return _ssl_context


def normalize_address(address: str) -> str:
    """A broker or nameserver base URL: ``host:port`` gets ``http://``; no trailing slash."""
    address = address.strip().rstrip("/")
    if "://" not in address:
        address = "http://" + address
    return address


def url(base: str, *segments: str | int) -> str:
    """``base`` + path segments, each percent-encoded (``%RETRY%g`` → ``%25RETRY%25g``)."""
    return base + "".join("/" + quote(str(s), safe="") for s in segments)


def parse_retry_after(value: str | None) -> float | None:
    """``Retry-After`` as seconds: a number of seconds or an HTTP date; None when absent/bad."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class _Answer(Protocol):
    """What is read of an answer, from either transport."""

    @property
    def content(self) -> bytes: ...

    @property
    def text(self) -> str: ...


def new_transport() -> WireTransport:
    """The SDK's default transport, with the SDK's connection limits and TLS context."""
    return WireTransport(max_connections=HTTP_MAX_CONNECTIONS,
                         max_idle=HTTP_MAX_KEEPALIVE_CONNECTIONS, ssl_context=shared_ssl_context)


def _tls_hint(exc: Exception, target: str) -> str:
    """A plain-HTTP request to a TLS port gets no answer (the server waits for a handshake and
    closes): say what probably happened."""
    closed = (isinstance(exc, httpx.RemoteProtocolError)
              or (isinstance(exc, WireError) and not isinstance(exc, WireConnectError)))
    if closed and target.startswith("http://"):
        return " (closed without an answer: if that port serves TLS, use https://)"
    return ""


class HttpClient:
    """Requests to any tidemq service; one instance is shared by a client's components."""

    def __init__(
        self,
        *,
        transport: Transport | None = None,
        timeout_s: float = REQUEST_TIMEOUT_S,
        retry: RetryPolicy = DEFAULT_RETRY,
        headers: Mapping[str, str] | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self._signer = signer_for(credentials)  # None: unsigned (a cluster without ACL)
        self.retry = retry
        self._headers = {"user-agent": "tidemq-python", **(headers or {})}
        self._wire: HttpTransport | None = None
        self._client: httpx.AsyncClient | None = None
        if not isinstance(transport, httpx.AsyncBaseTransport):
            self._wire = transport if transport is not None else new_transport()
        else:
            self._client = httpx.AsyncClient(
                transport=transport,
                timeout=httpx.Timeout(timeout_s),
                limits=httpx.Limits(max_connections=HTTP_MAX_CONNECTIONS,
                                    max_keepalive_connections=HTTP_MAX_KEEPALIVE_CONNECTIONS),
                verify=shared_ssl_context(),
            )
        self._closed = False
        self._sleep: Callable[[float], Awaitable[None]] = asyncio.sleep  # swapped in tests
        self._clock: Callable[[], float] = time.monotonic  # ... and this one with it

    def request_headers(self, content_type: str, has_body: bool) -> dict[str, str]:
        """Every request's headers, whatever carries it: the one place they are computed."""
        headers = {**self._headers, "accept": content_type}
        if has_body:
            headers["content-type"] = content_type
        return headers

    @property
    def closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            if self._wire is not None:
                await self._wire.aclose()
            if self._client is not None:
                await self._client.aclose()

    async def call(
        self,
        method: str,
        target: str,
        *,
        body: Any = None,
        params: Params | None = None,
        binary: bool = False,
        timeout_s: float | None = None,
        retry: RetryPolicy | None = None,
    ) -> Any:
        """Send a request (retrying per policy) and return its decoded answer.

        ``binary`` selects msgpack for the request body and asks for msgpack back.
        ``timeout_s`` overrides the client's timeout (long polls need more than their wait).
        """
        return await self._retrying(method, target, body, params, binary, timeout_s, retry,
                                    None)

    async def call_raw(self, method: str, target: str, content: bytes, content_type: str, *,
                       retry: RetryPolicy | None = None) -> Any:
        """``call`` with a body already encoded (``content_type``, e.g. record format v2
        batches); the answer is asked for in msgpack."""
        return await self._retrying(method, target, None, None, True, None, retry,
                                    (content, content_type))

    async def _retrying(self, method: str, target: str, body: Any, params: Params | None,
                        binary: bool, timeout_s: float | None, retry: RetryPolicy | None,
                        raw: tuple[bytes, str] | None) -> Any:
        policy = retry or self.retry
        started = self._clock()
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._once(method, target, body, params, binary, timeout_s, raw)
            except TidemqError as exc:
                pause = pause_after(policy, exc, attempt, self._clock() - started)
                log.debug("%s %s failed (attempt %d): %s; retrying in %.3fs", method, target,
                          attempt, exc, pause)
                await self._sleep(pause)

    async def _once(
        self, method: str, target: str, body: Any, params: Params | None, binary: bool,
        timeout_s: float | None, raw: tuple[bytes, str] | None = None,
    ) -> Any:
        if self._closed:
            raise ClientClosedError("the client is closed")
        content_type = CONTENT_MSGPACK if binary else CONTENT_JSON
        content: bytes | None
        if raw is not None:
            content = raw[0]
            headers = self.request_headers(content_type, False)
            headers["content-type"] = raw[1]
        else:
            content = encode_payload(body, content_type) if body is not None else None
            headers = self.request_headers(content_type, content is not None)
        if self._signer is not None:
            headers.update(self._signer.headers(method, target, params, content))
        if self._wire is not None:
            return await self._once_wire(self._wire, method, target, content, params, headers,
                                         timeout_s)
        assert self._client is not None
        timeout = httpx.Timeout(timeout_s) if timeout_s is not None else httpx.USE_CLIENT_DEFAULT
        try:
            response = await self._client.request(
                method, target, content=content, params=params, headers=headers,
                timeout=timeout,
            )
        except httpx.TimeoutException as exc:
            raise RequestTimeoutError(f"{method} {target}: no answer in time ({exc!r})",
                                      sent=not isinstance(exc, _NOT_SENT)) from exc
        except httpx.HTTPError as exc:
            if self._closed:
                raise ClientClosedError("the client is closed") from exc
            raise TransportError(f"{method} {target}: {exc!r}{_tls_hint(exc, target)}",
                                 sent=not isinstance(exc, _NOT_SENT)) from exc
        except RuntimeError as exc:  # httpx: "client has been closed"
            if self._closed:
                raise ClientClosedError("the client is closed") from exc
            raise
        return self._decode(method, target, response.status_code, response.headers, response,
                            response.reason_phrase)

    async def _once_wire(
        self, wire: HttpTransport, method: str, target: str, content: bytes | None,
        params: Params | None, headers: dict[str, str], timeout_s: float | None,
    ) -> Any:
        try:
            response = await wire.request(method, target, headers=headers, content=content,
                                          params=params,
                                          timeout_s=timeout_s if timeout_s is not None
                                          else self.timeout_s)
        except WireTimeout as exc:
            raise RequestTimeoutError(f"{method} {target}: no answer in time ({exc})",
                                      sent=exc.sent) from exc
        except WireError as exc:
            if self._closed:
                raise ClientClosedError("the client is closed") from exc
            raise TransportError(f"{method} {target}: {exc}{_tls_hint(exc, target)}",
                                 sent=not isinstance(exc, WireConnectError)) from exc
        except ValueError as exc:  # not an http(s) URL
            raise TransportError(f"{method} {target}: {exc}", sent=False) from exc
        return self._decode(method, target, response.status, response.headers, response,
                            response.reason)

    def _decode(self, method: str, target: str, status: int, headers: Mapping[str, str],
                response: _Answer, reason: str) -> Any:
        if status >= 400:
            raise self._error(status, headers, response, reason)
        try:
            return decode_payload(response.content, headers.get("content-type"))
        except ProtocolError as exc:
            raise UnexpectedResponseError(
                f"{method} {target}: undecodable {status} answer: {exc.message}"
            ) from exc

    @staticmethod
    def _error(status: int, headers: Mapping[str, str], response: _Answer,
               reason: str) -> ServerError:
        retry_after = parse_retry_after(headers.get("retry-after"))
        try:
            payload = decode_payload(response.content, headers.get("content-type"))
        except ProtocolError:
            payload = None
        if isinstance(payload, dict) and isinstance(payload.get("code"), str):
            return server_error(payload["code"], str(payload.get("message", "")), status,
                                retry_after)
        # No {code, message}: a proxy, or a framework default such as FastAPI's 422/404.
        detail = payload.get("detail") if isinstance(payload, dict) else None
        text = str(detail) if detail is not None else response.text[:200]
        if status in (400, 422):
            return BadRequestError("BAD_REQUEST", text, status, retry_after)
        return server_error(f"HTTP_{status}", text or reason, status,
                            retry_after)
