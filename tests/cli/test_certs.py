"""tidemq_server.cli.certs: the development CA and server certificate of `tidemq up --tls`."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography import x509

from tidemq_server.cli.certs import CA_FILE, CERT_FILE, KEY_FILE, ensure_dev_pki, main
from tidemq_server.common.tls import ServerTls


def names(cert_path: Path) -> set[str]:
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return ({str(n) for n in san.get_values_for_type(x509.DNSName)}
            | {str(ip) for ip in san.get_values_for_type(x509.IPAddress)})


def test_makes_a_ca_and_a_server_certificate_it_signed(tmp_path: Path) -> None:
    pki = ensure_dev_pki(tmp_path / "tls", ["broker-a", "10.0.0.7"])
    ca = x509.load_pem_x509_certificate(pki.ca.read_bytes())
    cert = x509.load_pem_x509_certificate(pki.cert.read_bytes())
    cert.verify_directly_issued_by(ca)  # raises when the CA did not sign it
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert names(pki.cert) == {"localhost", "127.0.0.1", "::1", "broker-a", "10.0.0.7"}
    ServerTls.load(pki.cert, pki.key)  # the key is the certificate's
    for private in (pki.key, tmp_path / "tls" / "ca.key"):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600, private


def test_a_second_run_keeps_the_files(tmp_path: Path) -> None:
    first = ensure_dev_pki(tmp_path, ["broker-a"])
    before = {p: p.read_bytes() for p in (first.ca, first.cert, first.key)}
    again = ensure_dev_pki(tmp_path, ["broker-a"])
    assert {p: p.read_bytes() for p in (again.ca, again.cert, again.key)} == before


def test_a_new_name_re_signs_the_certificate_with_the_same_ca(tmp_path: Path) -> None:
    first = ensure_dev_pki(tmp_path, ["broker-a"])
    ca_before, cert_before = first.ca.read_bytes(), first.cert.read_bytes()
    again = ensure_dev_pki(tmp_path, ["broker-b"])
    assert again.ca.read_bytes() == ca_before
    assert again.cert.read_bytes() != cert_before
    assert "broker-b" in names(again.cert)
    ca = x509.load_pem_x509_certificate(again.ca.read_bytes())
    x509.load_pem_x509_certificate(again.cert.read_bytes()).verify_directly_issued_by(ca)


def test_a_damaged_key_is_replaced(tmp_path: Path) -> None:
    pki = ensure_dev_pki(tmp_path)
    pki.key.write_bytes(b"not a key")
    ensure_dev_pki(tmp_path)
    ServerTls.load(pki.cert, pki.key)


def test_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["--dir", str(tmp_path / "out"), "--name", "nameserver-1", "--name", "console"])
    assert {p.name for p in (tmp_path / "out").iterdir()} == {CA_FILE, "ca.key", CERT_FILE,
                                                              KEY_FILE}
    assert {"nameserver-1", "console"} <= names(tmp_path / "out" / CERT_FILE)
    assert str(tmp_path / "out" / CA_FILE) in capsys.readouterr().out
