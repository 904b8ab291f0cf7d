"""TLS for every service: the server side from a certificate and key, the client side from one CA.

Server side: a service given ``tls_cert`` and ``tls_key`` (``TIDEMQ_<SERVICE>_TLS_CERT`` /
``_TLS_KEY``, PEM files) serves HTTPS on its port (uvicorn) and, for a broker, TLS on its gRPC
door. ``ServerTls.load`` reads both files once at start, so a missing file, a key that does not
match the certificate or a password-protected key stops the service with a message naming the
file, before it binds anything.

Client side: every client in the process (the SDK, the CLI, the internal clients of each
service) shares the SDK's one verifying context (``tidemq._http.shared_ssl_context``), which
trusts the CA bundle named by ``TIDEMQ_TLS_CA`` (or the default store). Nothing else is
configured per client: an https:// address is verified, an http:// one is plain.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidemq._http import shared_ssl_context, use_ca_bundle

if TYPE_CHECKING:
    import grpc

__all__ = ["ServerTls", "client_context", "scheme", "server_tls", "use_ca_bundle"]


def client_context() -> ssl.SSLContext:
    """The process's verifying client context (pass it as httpx's ``verify``)."""
    return shared_ssl_context()


def scheme(tls: bool) -> str:
    return "https" if tls else "http"


@dataclass(frozen=True, slots=True)
class ServerTls:
    """A service's certificate chain and private key (PEM files), checked to load together."""

    cert: Path
    key: Path

    @classmethod
    def load(cls, cert: str | Path, key: str | Path) -> ServerTls:
        tls = cls(Path(cert), Path(key))
        tls.server_context()  # fails now, naming the file, rather than at the first handshake
        return tls

    def server_context(self) -> ssl.SSLContext:
        for path in (self.cert, self.key):
            if not path.is_file():  # ssl's own error does not name the file
                raise ValueError(f"TLS file not found: {path}")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"cannot load the TLS certificate {self.cert} with the key "
                             f"{self.key}: {exc}") from exc
        return context

    def uvicorn_options(self) -> dict[str, Any]:
        """``uvicorn.Config`` keyword arguments serving HTTPS."""
        return {"ssl_certfile": str(self.cert), "ssl_keyfile": str(self.key)}

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """Server credentials of the gRPC door (no client certificate asked)."""
        import grpc  # only brokers serve gRPC: other processes need not load it

        return grpc.ssl_server_credentials([(self.key.read_bytes(), self.cert.read_bytes())])


def server_tls(cert: str, key: str) -> ServerTls | None:
    """``ServerTls`` when both files are named, None when neither; one alone is an error."""
    if not cert and not key:
        return None
    if not cert or not key:
        missing = "tls_cert" if not cert else "tls_key"
        raise ValueError(f"TLS needs both a certificate and its key: {missing} is not set")
    return ServerTls.load(cert, key)
