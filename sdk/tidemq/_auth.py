"""Signing the SDK's requests when the cluster runs with accounts (docs/api.md Authentication).

``Credentials(access_key, secret_key)`` is given to a client's constructor (``credentials=``),
or read from ``TIDEMQ_ACCESS_KEY`` / ``TIDEMQ_SECRET_KEY``; without either, requests go
unsigned, as a cluster without ACL expects. The string to sign is built by
``tidemq.protocol.signing``, the same code the services verify with.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx

from tidemq._exceptions import ConfigurationError
from tidemq.protocol.signing import ACCESS_KEY_ENV, SECRET_KEY_ENV, sign_rest


@dataclass(frozen=True, slots=True)
class Credentials:
    """An account's keys; the secret never appears in ``repr``."""

    access_key: str
    secret_key: str = field(repr=False)

    def __post_init__(self) -> None:
        if not self.access_key or not self.secret_key:
            raise ConfigurationError("credentials need both an access key and a secret key")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Credentials | None:
        """From ``TIDEMQ_ACCESS_KEY`` / ``TIDEMQ_SECRET_KEY``; None when neither is set."""
        env = os.environ if env is None else env
        ak, sk = env.get(ACCESS_KEY_ENV, ""), env.get(SECRET_KEY_ENV, "")
        if not ak and not sk:
            return None
        if not ak or not sk:
            raise ConfigurationError(f"set both {ACCESS_KEY_ENV} and {SECRET_KEY_ENV}, "
                                     "or neither")
        return cls(ak, sk)


class Signer:
    """Signs one request: the headers to add, from what httpx will send."""

    def __init__(self, credentials: Credentials) -> None:
        self.credentials = credentials

    def headers(self, method: str, target: str,
                params: Mapping[str, str | int | float] | None, content: bytes | None,
                ) -> dict[str, str]:
        url = httpx.URL(target, params=params) if params else httpx.URL(target)
        c = self.credentials
        return sign_rest(c.access_key, c.secret_key, method, url.raw_path.split(b"?")[0].decode(),
                         url.query.decode(), content)


def signer_for(credentials: Credentials | None) -> Signer | None:
    """The signer of explicit credentials, else of the environment's, else None (unsigned)."""
    chosen = credentials if credentials is not None else Credentials.from_env()
    return Signer(chosen) if chosen is not None else None
