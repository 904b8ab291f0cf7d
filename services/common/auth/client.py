"""A service's own account: signing its requests to the other services (ACL on).

``signing_auth(access_key, secret_key)`` is an ``httpx.Auth`` for the internal clients (broker
client, registrar, scheduler client, console, metrics reader); None without keys, so a cluster
without ACL keeps sending the cluster token alone.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import httpx
from tidemq.protocol.signing import ACCESS_KEY_ENV, SECRET_KEY_ENV, sign_rest


class SigningAuth(httpx.Auth):
    requires_request_body = True

    def __init__(self, access_key: str, secret_key: str) -> None:
        self.access_key = access_key
        self._secret_key = secret_key

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        path = request.url.raw_path.split(b"?", 1)[0].decode("latin-1")
        request.headers.update(self.sign(request.method, path,
                                         request.url.query.decode("latin-1"), request.content))
        yield request

    def sign(self, method: str, path: str, query: str, body: bytes) -> dict[str, str]:
        """The signing headers of one request (``path`` and ``query`` as sent), for a client
        that is not httpx (the replica's fetch client)."""
        return sign_rest(self.access_key, self._secret_key, method, path, query, body)


def signing_auth(access_key: str, secret_key: str) -> SigningAuth | None:
    if not access_key or not secret_key:
        return None
    return SigningAuth(access_key, secret_key)


_account: tuple[str, str] | None = None


def use_account(access_key: str, secret_key: str) -> None:
    """This process's service account (from its settings); every internal client built after
    this signs with it, in this process and (through the environment, unless set already) in
    its children. Without one, ``TIDEMQ_ACCESS_KEY`` / ``TIDEMQ_SECRET_KEY`` are used."""
    global _account
    _account = (access_key, secret_key) if access_key and secret_key else None
    if _account is not None:  # child processes too (the metrics job's Spark workers)
        os.environ.setdefault(ACCESS_KEY_ENV, access_key)
        os.environ.setdefault(SECRET_KEY_ENV, secret_key)


def service_auth() -> SigningAuth | None:
    """The ``httpx.Auth`` of this process's account, or None (unsigned: ACL off)."""
    if _account is not None:
        return SigningAuth(*_account)
    return signing_auth(os.environ.get(ACCESS_KEY_ENV, ""), os.environ.get(SECRET_KEY_ENV, ""))
