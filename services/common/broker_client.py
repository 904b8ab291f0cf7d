"""The client of the broker's internal API (``/internal/v1/*``) the other services use.

The checker (transactions), the scheduler (delays) and the metrics job (bulk body pulls) talk to
the broker through this module: msgpack both ways, the cluster token in ``TOKEN_HEADER``. The
metrics job runs inside Spark's Python workers, so next to the async ``BrokerClient`` there is a
blocking ``BlockingBrokerClient`` with the same error rules.

Every failure is a ``BrokerError``:

- ``BrokerDown``: retriable — no connection, a timeout, a 503 answer or an answer that cannot be
  decoded (a proxy page, a cut-off body). ``maybe_done`` says whether the request may have taken
  effect: no answer came back, or a replicated primary answered ``NOT_ENOUGH_REPLICAS`` or
  ``NOT_PRIMARY`` (both may come after the records were written: too few copies in time, or the
  fence shut before the answer); any other 503 did nothing;
- ``BrokerRefused``: any other error answer — a bug or a misconfiguration, worth a loud log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable
from typing import Any, cast
from urllib.parse import quote

import httpx
import msgpack
import orjson
from tidemq._moved import abandon_if_moved
from tidemq.protocol import CONTENT_MSGPACK

from tidemq_server.common.auth.client import service_auth
from tidemq_server.common.constants import (
    DISCOVERY_RETRY_S,
    HTTP_CLIENT_KEEP_ALIVE_S,
    LONG_POLL_MAX_MS,
    MOVED_CHECK_S,
    TOKEN_HEADER,
)
from tidemq_server.common.discovery import BrokerResolver, GroupUnknown
from tidemq_server.common.tls import client_context

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 30.0  # per request, unless the call says otherwise (s)
MAX_CONNECTIONS = 32  # keep-alive connections of one async client
MAX_BODIES = 1024  # records one bulk body pull answers at most (the broker's limit)
# How a pooled connection the server closed while it sat idle fails: the request goes out and
# the server hangs up without an answer. An idempotent read is sent again at once, quietly.
STALE_CONNECTION = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


class BrokerError(Exception):
    """The broker did not do what was asked."""


class BrokerDown(BrokerError):
    """The broker cannot take the request now; retry later. ``code``: the 503's error code
    ("" when no answer came back)."""

    def __init__(self, message: str, maybe_done: bool = True, code: str = "") -> None:
        super().__init__(message)
        self.maybe_done = maybe_done
        self.code = code

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across Spark's processes
        return type(self), (str(self), self.maybe_done, self.code)


class BrokerRefused(BrokerError):
    """The broker answered an error other than "busy" or "unavailable"."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across Spark's processes
        return type(self), (self.status, self.code, self.message)


def _headers(token: str, user_agent: str) -> dict[str, str]:
    headers = {"accept": CONTENT_MSGPACK, "user-agent": user_agent}
    if token:
        headers[TOKEN_HEADER] = token
    return headers


def _encode(obj: Any) -> bytes:
    return cast(bytes, msgpack.packb(obj, use_bin_type=True))


def _answer(what: str, resp: httpx.Response) -> Any:
    """The decoded answer of a 2xx response; raises ``BrokerDown`` / ``BrokerRefused`` else.
    Maps may be keyed by integers (queue ids), so msgpack maps are decoded without the
    string-key restriction."""
    status = resp.status_code
    data: Any = {}
    if resp.content:
        try:
            if "msgpack" in resp.headers.get("content-type", ""):
                data = msgpack.unpackb(resp.content, raw=False, strict_map_key=False)
            else:
                data = orjson.loads(resp.content)
        except (ValueError, msgpack.UnpackException) as exc:
            if status < 400:
                raise BrokerDown(f"{what}: undecodable answer (HTTP {status})") from exc
            data = {"message": resp.text[:500]}
    if status >= 400:
        code = str(data.get("code", "")) if isinstance(data, dict) else ""
        message = str(data.get("message", "")) if isinstance(data, dict) else ""
        if status == 503:
            raise BrokerDown(f"{what}: {code}: {message}", maybe_done=code in AFTER_WRITE,
                             code=code)
        raise BrokerRefused(status, code, message)
    return data


#: 503 codes a write may answer after its records were written (retry strict, or dedup)
AFTER_WRITE = frozenset({"NOT_ENOUGH_REPLICAS", "NOT_PRIMARY"})
#: 503 codes saying the group's primary is elsewhere now: a client following its group asks the
#: nameservers again before the next request (a failover, a planned restart)
MOVED = frozenset({"NOT_PRIMARY"})


def bodies_path(topic: str, queue_id: int) -> str:
    """The bulk body pull of one queue (bodies and queue offsets only; reads system topics)."""
    return f"/internal/v1/topics/{quote(topic, safe='')}/queues/{queue_id}/bodies"


def deliver_body(payloads: list[bytes], strict: list[int]) -> bytes:
    """``{records: [...], strict: [...]}`` in msgpack, splicing records already encoded
    (``DeliveryRow``s as the timer log keeps them) without decoding them again."""
    n = len(payloads)
    if n < 16:
        head = bytes([0x90 | n])
    elif n < 0x10000:
        head = b"\xdc" + n.to_bytes(2, "big")
    else:
        head = b"\xdd" + n.to_bytes(4, "big")
    return b"".join([b"\x82", _encode("records"), head, *payloads,
                     _encode("strict"), _encode(strict)])


def _keys(offsets: dict[int, int]) -> dict[str, int]:
    """msgpack maps keyed by strings (the broker decodes request maps with string keys only)."""
    return {str(k): v for k, v in offsets.items()}


class BrokerClient:
    """Async client of one broker's internal API (checker and scheduler).

    With a ``resolver`` the client follows its broker group: every request asks the resolver
    for the group's current address (cached there) and re-points the client when it moved; a
    request that cannot reach the broker, or that it refuses as no longer primary
    (``NOT_PRIMARY``), makes the resolver ask the nameservers again. A request left unanswered
    for ``moved_check_s`` past the time the broker may hold it (a paused primary, or one cut off
    from this host, answers nothing until its heal or the timeout) makes the resolver ask again
    too, then every ``DISCOVERY_RETRY_S``; once the nameservers name another primary the request
    is abandoned as ``BrokerDown`` (``maybe_done``: a write retried strict, or met by the dedup,
    at the new primary), so a failover costs the election, not this client's timeout (issue 32:
    timers through a failover).
    """

    def __init__(self, base_url: str, token: str, timeout_s: float = DEFAULT_TIMEOUT_S, *,
                 user_agent: str = "tidemq", max_connections: int = MAX_CONNECTIONS,
                 transport: httpx.AsyncBaseTransport | None = None,
                 resolver: BrokerResolver | None = None,
                 moved_check_s: float = MOVED_CHECK_S) -> None:
        self.resolver = resolver
        self.moved_check_s = moved_check_s
        self.base_url = base_url.rstrip("/")
        self.http = httpx.AsyncClient(base_url=self.base_url, headers=_headers(token, user_agent),
                                      timeout=timeout_s, transport=transport,
                                      verify=client_context(), auth=service_auth(),
                                      limits=httpx.Limits(
                                          max_connections=max_connections,
                                          keepalive_expiry=HTTP_CLIENT_KEEP_ALIVE_S))

    async def close(self) -> None:
        await self.http.aclose()
        if self.resolver is not None:
            await self.resolver.close()

    def describe(self) -> str:
        """The broker for log lines: its URL, or the group and how it is found."""
        return self.resolver.describe() if self.resolver is not None else self.base_url

    async def follow(self) -> str:
        """Point the client at the group's current address (the resolver's); that address."""
        if self.resolver is None:
            return self.base_url
        try:
            url = await self.resolver.address()
        except GroupUnknown as exc:
            raise BrokerDown(str(exc), maybe_done=False) from exc
        if url != self.base_url:
            self.base_url = url
            self.http.base_url = httpx.URL(url)
        return url

    async def call(self, method: str, path: str, *, obj: Any = None, body: bytes | None = None,
                   params: dict[str, Any] | None = None, timeout_s: float | None = None,
                   held_s: float = 0.0) -> Any:
        """One request: ``obj`` (encoded here) or ``body`` (already msgpack) as its body;
        ``held_s``: how long the broker may hold it on purpose (a long poll's wait)."""
        content = body if body is not None else (_encode(obj) if obj is not None else None)
        headers = {"content-type": CONTENT_MSGPACK} if content is not None else None
        url = await self.follow()
        what = f"{method} {url}{path}"
        request = self.http.request(
            method, path, content=content, params=params, headers=headers,
            timeout=timeout_s if timeout_s is not None else httpx.USE_CLIENT_DEFAULT)
        try:
            if self.resolver is not None and self.resolver.discovered:
                resp = await self._unless_moved(request, url, what, held_s + self.moved_check_s)
            else:
                resp = await request
        except httpx.HTTPError as exc:
            if self.resolver is not None and isinstance(exc, httpx.TransportError):
                self.resolver.invalidate()
            raise BrokerDown(f"{what}: {type(exc).__name__}: {exc}") from exc
        try:
            return _answer(what, resp)
        except BrokerDown as exc:
            if self.resolver is not None and exc.code in MOVED:
                self.resolver.invalidate()
            raise

    async def _unless_moved(self, request: Awaitable[httpx.Response], url: str, what: str,
                            after_s: float) -> httpx.Response:
        """``request`` (to ``url``), abandoned once the nameservers name another primary of
        the group while it is still unanswered ``after_s`` after it began."""
        resolver = self.resolver
        assert resolver is not None

        async def primary_now() -> str | None:
            resolver.invalidate()  # ask the nameservers (at most every retry_s)
            try:
                return await resolver.address()
            except GroupUnknown:
                return None

        def moved(now: str, waited: float) -> Exception:
            return BrokerDown(f"{what}: no answer in {waited:.1f}s, and the group's primary "
                              f"is {now} now")

        return await abandon_if_moved(request, url, primary_now, moved, check_s=after_s,
                                      poll_s=DISCOVERY_RETRY_S)

    async def retention_floor(self, owner: str, physical_offset: int) -> None:
        """Keep the broker's commit log from ``physical_offset`` on for ``owner``."""
        await self.call("POST", "/internal/v1/retention-floor",
                        obj={"owner": owner, "physical_offset": physical_offset})

    # --- transactions (the checker) -----------------------------------------------------------
    async def transactions_info(self) -> dict[str, Any]:
        answer: dict[str, Any] = await self.call("GET", "/internal/v1/transactions/info")
        return answer

    async def halves(self, offset: int, max_count: int, wait_ms: int = 0) -> dict[str, Any]:
        """A page of the half queue from ``offset``; held up to ``wait_ms`` at its end."""
        params = {"offset": offset, "max": max_count}
        if wait_ms > 0:
            params["wait_ms"] = min(wait_ms, LONG_POLL_MAX_MS)
        answer: dict[str, Any] = await self.call(
            "GET", "/internal/v1/transactions/halves", params=params,
            timeout_s=wait_ms / 1000 + DEFAULT_TIMEOUT_S if wait_ms > 0 else None,
            held_s=max(0, wait_ms) / 1000)
        return answer

    async def ops(self, offset: int, max_count: int) -> dict[str, Any]:
        answer: dict[str, Any] = await self.call(
            "GET", "/internal/v1/transactions/ops", params={"offset": offset, "max": max_count})
        return answer

    async def act(self, actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        answer = await self.call("POST", "/internal/v1/transactions/actions",
                                 obj={"actions": actions})
        results: list[dict[str, Any]] = answer.get("results", [])
        return results

    # --- delayed messages (the scheduler) -----------------------------------------------------
    async def schedule_info(self) -> dict[str, Any]:
        answer: dict[str, Any] = await self.call("GET", "/internal/v1/schedule/info")
        return answer

    async def intake(self, offset: int, max_count: int, wait_ms: int) -> dict[str, Any]:
        """Timers of the intake topic from ``offset`` (``IntakeRow``s), held up to ``wait_ms``."""
        answer: dict[str, Any] = await self.call(
            "GET", "/internal/v1/schedule/intake",
            params={"offset": offset, "max": max_count, "wait_ms": wait_ms},
            timeout_s=wait_ms / 1000 + DEFAULT_TIMEOUT_S, held_s=wait_ms / 1000)
        return answer

    async def timer_cancels(self, offset: int, max_count: int) -> dict[str, Any]:
        """Ids of cancelled delayed messages (``TIDE_SYS_TIMER_CANCELS``) from ``offset``."""
        answer: dict[str, Any] = await self.call(
            "GET", "/internal/v1/schedule/cancels", params={"offset": offset, "max": max_count})
        return answer

    async def levels_due(self, offsets: dict[int, int], now_ms: int,
                         max_count: int) -> dict[str, Any]:
        """Due records (``DueRecord``s) of each delay level from ``offsets``."""
        answer: dict[str, Any] = await self.call(
            "POST", "/internal/v1/schedule/levels/due",
            obj={"offsets": _keys(offsets), "now_ms": now_ms, "max": max_count})
        return answer

    async def deliver(self, body: bytes) -> dict[str, Any]:
        """Store due messages (a ``deliver_body``) in their real topics."""
        answer: dict[str, Any] = await self.call("POST", "/internal/v1/schedule/deliver",
                                                 body=body)
        return answer

    async def schedule_progress(self, owner: str, positions: list[tuple[str, int, int]]) -> int:
        """Report (topic, queue, next offset) positions; the retention floor they became."""
        answer = await self.call("POST", "/internal/v1/schedule/progress",
                                 obj={"owner": owner, "positions": positions})
        return int(answer.get("floor", 0))

    async def pending(self, offsets: dict[int, int], intake_offset: int, topic: str | None,
                      skip: list[tuple[int, int]]) -> dict[str, Any]:
        answer: dict[str, Any] = await self.call(
            "POST", "/internal/v1/schedule/pending",
            obj={"offsets": _keys(offsets), "intake_offset": intake_offset, "topic": topic,
                 "skip": skip})
        return answer


class BlockingBrokerClient:
    """Blocking client of one broker (the metrics job's Spark workers): one keep-alive
    connection, opened on first use (so an instance pickles before it is used). A request the
    broker cannot take (``BrokerDown``) is tried ``attempts`` times, backing off from
    ``retry_base_s`` and doubling; only idempotent reads go through it."""

    def __init__(self, base_url: str, token: str, timeout_s: float = DEFAULT_TIMEOUT_S, *,
                 user_agent: str = "tidemq", attempts: int = 1,
                 retry_base_s: float = 0.25) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        self.user_agent = user_agent
        self.attempts = max(1, attempts)
        self.retry_base_s = retry_base_s
        self._http: httpx.Client | None = None
        self._failures = 0  # failed attempts since the broker last answered

    @property
    def http(self) -> httpx.Client:
        if self._http is None:
            self._http = httpx.Client(base_url=self.base_url,
                                      headers=_headers(self.token, self.user_agent),
                                      timeout=self.timeout_s, verify=client_context(),
                                      auth=service_auth(),
                                      limits=httpx.Limits(
                                          keepalive_expiry=HTTP_CLIENT_KEEP_ALIVE_S))
        return self._http

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    def get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        """GET with retries. A stale pooled connection (``STALE_CONNECTION``) is sent again at
        once, logged at DEBUG only. Of the other failures the first after an answer is logged at
        WARNING and later ones are only counted: the count is logged when the broker answers
        again, or is in the error raised after the last attempt."""
        what = f"GET {self.base_url}{path}"
        delay = self.retry_base_s
        stale_retried = False
        attempt = 0
        while True:
            try:
                answer = _answer(what, self.http.get(path, params=params))
            except BrokerDown as exc:
                down = exc
            except httpx.HTTPError as exc:
                if isinstance(exc, STALE_CONNECTION) and not stale_retried:
                    stale_retried = True
                    log.debug("%s: %s (connection closed by the server); sending again", what,
                              type(exc).__name__)
                    continue
                down = BrokerDown(f"{what}: {type(exc).__name__}: {exc}")
                down.__cause__ = exc
            else:
                if self._failures:
                    log.warning("%s: the broker answers again after %d failed attempts", what,
                                self._failures)
                    self._failures = 0
                return answer
            attempt += 1
            self._failures += 1
            if attempt >= self.attempts:
                raise BrokerDown(f"{down} (attempt {attempt} of {self.attempts}; "
                                 f"{self._failures} failed in a row)", down.maybe_done) from down
            if self._failures == 1:
                log.warning("%s; retrying (further failures are counted until the broker "
                            "answers)", down)
            time.sleep(delay)
            delay *= 2

    def bodies(self, topic: str, queue_id: int, offset: int, max_count: int) -> dict[str, Any]:
        """Bodies and queue offsets of one queue from ``offset`` (the bulk internal pull)."""
        answer: dict[str, Any] = self.get(
            bodies_path(topic, queue_id),
            {"offset": offset, "max": max(1, min(max_count, MAX_BODIES))})
        return answer

    def describe_topic(self, topic: str) -> dict[str, Any] | None:
        """The public topic description (queue offsets included); None when there is none."""
        try:
            answer: dict[str, Any] = self.get(f"/v1/topics/{quote(topic, safe='')}")
        except BrokerRefused as exc:
            if exc.status == 404:
                return None
            raise
        return answer
