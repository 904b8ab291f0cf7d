"""A development CA and one server certificate for every tidemq service (``tidemq up --tls``).

Files, under one directory (``<data-dir>/tls`` for `tidemq up`, a volume in docker-compose)::

    ca.pem       the CA certificate: give it to clients (TIDEMQ_TLS_CA)
    ca.key       the CA's private key (mode 0600): signs the server certificate
    server.pem   the services' certificate, signed by the CA, for every name in ``names``
    server.key   its private key (mode 0600)

Made once and kept: a later run reuses the CA, and the server certificate too while it still
covers every name asked for and is more than a week from expiry (else a new one is signed by
the same CA, so clients holding ca.pem keep working). ECDSA P-256 keys, SHA-256 signatures.

For development and closed deployments; a public deployment should bring certificates from its
own CA (``TIDEMQ_<SERVICE>_TLS_CERT`` / ``_TLS_KEY``, docs/operations.md).

``python -m tidemq_server.cli.certs --dir DIR [--name NAME ...]`` makes them (the compose init
step).
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_FILE, CA_KEY_FILE = "ca.pem", "ca.key"
CERT_FILE, KEY_FILE = "server.pem", "server.key"
CA_DAYS = 3650  # validity of the development CA (days)
CERT_DAYS = 825  # validity of a server certificate (days; the most clients accept)
RENEW_BEFORE = dt.timedelta(days=7)  # a server certificate this close to expiry is re-signed
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")  # always in the server certificate


@dataclass(frozen=True)
class DevPki:
    ca: Path  # ca.pem
    cert: Path  # server.pem
    key: Path  # server.key


def _write(path: Path, data: bytes, private: bool) -> None:
    """Write ``data`` to ``path`` atomically; a private file is created mode 0600."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _san(names: Iterable[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            out.append(x509.DNSName(name))
    return out


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _make_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tidemq development CA")])
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    _write(directory / CA_KEY_FILE, _key_pem(key), private=True)
    _write(directory / CA_FILE, cert.public_bytes(serialization.Encoding.PEM), private=False)
    return cert, key


def _load_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None:
    try:
        cert = x509.load_pem_x509_certificate((directory / CA_FILE).read_bytes())
        key = serialization.load_pem_private_key((directory / CA_KEY_FILE).read_bytes(), None)
    except (FileNotFoundError, ValueError):
        return None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or cert.not_valid_after_utc < _now():
        return None
    return cert, key


def _covers(directory: Path, ca: x509.Certificate, names: list[str]) -> bool:
    """True when the kept server certificate is the CA's, names every one of ``names`` and is
    not about to expire, and its key is there."""
    try:
        cert = x509.load_pem_x509_certificate((directory / CERT_FILE).read_bytes())
        serialization.load_pem_private_key((directory / KEY_FILE).read_bytes(), None)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (FileNotFoundError, ValueError, x509.ExtensionNotFound):
        return False
    return (cert.issuer == ca.subject and cert.not_valid_after_utc - RENEW_BEFORE > _now()
            and set(_san(names)) <= set(san))


def _sign_server(directory: Path, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey,
                 names: list[str]) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=CERT_DAYS))
            .add_extension(x509.SubjectAlternativeName(_san(names)), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    _write(directory / KEY_FILE, _key_pem(key), private=True)
    _write(directory / CERT_FILE, cert.public_bytes(serialization.Encoding.PEM), private=False)


def ensure_dev_pki(directory: Path, names: Iterable[str] = ()) -> DevPki:
    """The CA and server certificate under ``directory``, made or renewed as needed; the
    server certificate names ``localhost``, 127.0.0.1, ::1 and every one of ``names``."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o755)  # the keys are 0600; the CA and certificate are public
    wanted = list(dict.fromkeys([*LOCAL_NAMES, *(n for n in names if n)]))
    loaded = _load_ca(directory)
    ca, ca_key = loaded if loaded is not None else _make_ca(directory)
    if loaded is None or not _covers(directory, ca, wanted):
        _sign_server(directory, ca, ca_key, wanted)
    return DevPki(ca=directory / CA_FILE, cert=directory / CERT_FILE, key=directory / KEY_FILE)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tidemq_server.cli.certs",
                                     description="Make a development CA and server cert.")
    parser.add_argument("--dir", type=Path, required=True, help="where the files go")
    parser.add_argument("--name", action="append", default=[],
                        help="a host name or IP the services are reached by (repeatable)")
    args = parser.parse_args(argv)
    pki = ensure_dev_pki(args.dir, args.name)
    print(f"CA {pki.ca}; certificate {pki.cert} for "
          f"{', '.join([*LOCAL_NAMES, *args.name])}", flush=True)


if __name__ == "__main__":
    main()
