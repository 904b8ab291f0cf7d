"""tidemq_server.cli.init_secrets: the compose init step's TLS files and accounts file."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tidemq_server.cli.init_secrets import (
    ACL_FILE,
    ADMIN_FILE,
    SERVICES_KEY_ENV,
    SERVICES_SECRET_ENV,
    admin_keys,
    main,
)
from tidemq_server.common.auth.store import load_policy

SECRET = "a-services-secret-of-some-length"


def test_makes_tls_files_and_an_acl_file_the_services_load(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(SERVICES_KEY_ENV, "svc-key")
    monkeypatch.setenv(SERVICES_SECRET_ENV, SECRET)
    main(["--dir", str(tmp_path), "--acl", "--name", "broker-a"])
    assert {p.name for p in tmp_path.iterdir()} == {"ca.pem", "ca.key", "server.pem",
                                                    "server.key", ACL_FILE, ADMIN_FILE}
    policy = load_policy(tmp_path / ACL_FILE)
    admin_ak, admin_sk = admin_keys(tmp_path)
    assert {u.name for u in policy.users.values()} == {"tidemq-services", "admin"}
    assert policy.users["svc-key"].secret_key == SECRET
    assert policy.users[admin_ak].secret_key == admin_sk
    for private in (ACL_FILE, ADMIN_FILE, "server.key"):
        assert stat.S_IMODE((tmp_path / private).stat().st_mode) == 0o600, private
    said = capsys.readouterr().out
    assert SECRET not in said and admin_sk not in said  # files named, no secret printed


def test_a_second_run_keeps_the_admin_and_takes_a_new_services_secret(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SERVICES_KEY_ENV, "svc-key")
    monkeypatch.setenv(SERVICES_SECRET_ENV, SECRET)
    main(["--dir", str(tmp_path), "--acl"])
    admin = admin_keys(tmp_path)
    monkeypatch.setenv(SERVICES_SECRET_ENV, SECRET + "-rotated")
    main(["--dir", str(tmp_path), "--acl"])
    assert admin_keys(tmp_path) == admin
    policy = load_policy(tmp_path / ACL_FILE)
    assert policy.users["svc-key"].secret_key == SECRET + "-rotated"


def test_refuses_a_missing_or_short_services_secret(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SERVICES_KEY_ENV, "svc-key")
    monkeypatch.setenv(SERVICES_SECRET_ENV, "short")
    with pytest.raises(SystemExit, match=SERVICES_SECRET_ENV):
        main(["--dir", str(tmp_path), "--acl"])
    assert not (tmp_path / ACL_FILE).exists()


def test_without_acl_only_tls_files(tmp_path: Path) -> None:
    main(["--dir", str(tmp_path)])
    assert not (tmp_path / ACL_FILE).exists() and (tmp_path / "server.pem").exists()
