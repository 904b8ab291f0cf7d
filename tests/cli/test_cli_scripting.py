"""`tidemq` driven by scripts: --version, exit statuses by error code, JSON errors, settings
from a file with profiles (precedence option > environment > profile > default), --timeout."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tidemq
from tidemq.protocol.codes import ErrorCode
from typer.testing import CliRunner

from tests.support.procs import REPO, ServiceProcess, free_port
from tidemq_server.cli import app
from tidemq_server.cli.config import Profile, load_profile
from tidemq_server.cli.errors import EXIT_CODES, exit_code_for
from tidemq_server.cli.rest import DEFAULT_TIMEOUT_S, CliError, answer
from tidemq_server.cli.root import endpoints_from

DEAD = {"TIDEMQ_NAMESERVER_URL": "http://127.0.0.1:1", "TIDEMQ_BROKER_URL": "http://127.0.0.1:1"}


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def no_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No settings file of the user's: XDG_CONFIG_HOME is an empty temp dir."""
    for name in ("TIDEMQ_CONFIG", "TIDEMQ_PROFILE", "TIDEMQ_NAMESERVER_URL", "TIDEMQ_BROKER_URL",
                 "TIDEMQ_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg"


@pytest.fixture(scope="module")
def nameserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    port = free_port()
    proc = ServiceProcess("nameserver", port, {"TIDEMQ_NAMESRV_PORT": str(port)},
                          tmp_path_factory.mktemp("cli-scripting-ns")).start()
    yield proc
    proc.stop()


def tidemq_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real command, as a script runs it."""
    return subprocess.run([sys.executable, "-m", "tidemq_server.cli", *args], cwd=REPO,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=60)


# --- version ----------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [["--version"], ["-V"], ["version"]])
def test_version_in_every_spelling(runner: CliRunner, args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"tidemq {tidemq.__version__}"


# --- exit statuses ----------------------------------------------------------------------------

def test_every_rest_error_code_has_an_exit_status() -> None:
    assert set(ErrorCode) <= set(EXIT_CODES)


@pytest.mark.parametrize(("status", "code", "exit_code"), [
    (400, "BAD_REQUEST", 2), (400, "INVALID_TOPIC_NAME", 2), (413, "MESSAGE_TOO_LARGE", 2),
    (404, "TOPIC_NOT_FOUND", 3), (404, "MESSAGE_NOT_FOUND", 3), (404, "NOT_FOUND", 3),
    (401, "UNAUTHORIZED", 4), (403, "FORBIDDEN", 4), (409, "QUEUES_NOT_EMPTY", 4),
    (409, "TRANSACTION_ALREADY_ENDED", 4),
    (503, "UNAVAILABLE", 5), (503, "BROKER_BUSY", 5), (503, "NOT_PRIMARY", 5),
    (500, "INTERNAL_ERROR", 1), (418, "SOMETHING_NEW", 1)])
def test_server_error_code_chooses_the_exit_status(status: int, code: str,
                                                   exit_code: int) -> None:
    with pytest.raises(CliError) as raised:
        answer(httpx.Response(status, json={"code": code, "message": "why"}))
    assert (raised.value.code, raised.value.detail) == (code, "why")
    assert raised.value.exit_code == exit_code


def test_non_json_error_answer_by_http_status() -> None:
    assert exit_code_for("HTTP_404") == 3
    assert exit_code_for("HTTP_409") == 4
    assert exit_code_for("HTTP_502") == 5
    assert exit_code_for("HTTP_400") == 2


@pytest.mark.integration
def test_not_found_exits_3_and_unreachable_exits_5(runner: CliRunner,
                                                   nameserver: ServiceProcess,
                                                   no_config: Path) -> None:
    # The nameserver has no /v1/messages/...: it answers NOT_FOUND like any service.
    result = runner.invoke(app, ["--broker", nameserver.url, "query", "--id", "x"])
    assert result.exit_code == 3, result.output
    result = runner.invoke(app, ["cluster"], env=DEAD)
    assert result.exit_code == 5, result.output
    assert result.stderr.startswith("UNAVAILABLE: cannot reach")


def test_help_documents_the_exit_statuses(runner: CliRunner) -> None:
    result = runner.invoke(app, ["--help"], env={"COLUMNS": "300"})
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for words in ("2 usage", "3 not found", "4 refused", "5 unavailable", "TIDEMQ_PROFILE",
                  "TIDEMQ_TIMEOUT"):
        assert words in text, words


# --- JSON errors ------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [["cluster", "--json"], ["--json", "cluster"],
                                  ["--json", "topic", "list"]])
def test_json_errors_are_one_object_on_stderr(runner: CliRunner, no_config: Path,
                                              args: list[str]) -> None:
    result = runner.invoke(app, args, env=DEAD)
    assert result.exit_code == 5, result.output
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    error = json.loads(line)
    assert error["code"] == "UNAVAILABLE"
    assert error["message"].startswith("cannot reach")


def test_json_usage_error_from_the_real_command(no_config: Path) -> None:
    done = tidemq_cli("--json", "topic", "show", "t", "--no-such-option")
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert json.loads(line) == {"code": "USAGE", "message": "No such option: --no-such-option"}


# --- timeout ----------------------------------------------------------------------------------

def test_timeout_from_the_environment(runner: CliRunner, no_config: Path) -> None:
    with socket.socket() as silent:  # accepts connections (the backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        began = time.monotonic()
        result = runner.invoke(app, ["--json", "--nameserver", url, "topic", "list"],
                               env={"TIDEMQ_TIMEOUT": "0.2"})
        took = time.monotonic() - began
    assert result.exit_code == 5, result.output
    error = json.loads(result.stderr)
    assert error["code"] == "UNAVAILABLE"  # every nameserver failed …
    assert "ReadTimeout" in error["message"] or "timed out" in error["message"]  # … in time
    assert took < DEFAULT_TIMEOUT_S * 0.8  # not the default 10 s


def test_bad_timeout_is_a_usage_error(runner: CliRunner, no_config: Path) -> None:
    result = runner.invoke(app, ["cluster"], env={"TIDEMQ_TIMEOUT": "soon"})
    assert result.exit_code == 2
    assert "TIDEMQ_TIMEOUT" in result.output


# --- settings file and profiles ---------------------------------------------------------------

PROFILES = """
default_profile = "dev"

[profiles.dev]
nameserver = "http://dev-ns:9876"
broker = "http://dev-broker:10911"
timeout = 3

[profiles.prod]
nameserver = ["https://ns1:9876", "https://ns2:9876/"]
access_key = "ops"
secret_key = "s3cret"
token = "tok"
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_profile_file_under_xdg_config_home(no_config: Path) -> None:
    write(no_config / "tidemq" / "config.toml", PROFILES)
    dev = load_profile(None)
    assert (dev.name, dev.nameservers, dev.broker, dev.timeout_s) == (
        "dev", ("http://dev-ns:9876",), "http://dev-broker:10911", 3.0)
    prod = load_profile("prod")
    assert prod.nameservers == ("https://ns1:9876", "https://ns2:9876")
    assert (prod.access_key, prod.secret_key, prod.token) == ("ops", "s3cret", "tok")


def test_no_file_no_profile(no_config: Path) -> None:
    assert load_profile(None) == Profile()


def test_precedence_option_then_environment_then_profile_then_default() -> None:
    dev = Profile(name="dev", nameservers=("http://dev-ns:9876",), broker="http://dev-b:1",
                  timeout_s=3.0, access_key="ops", secret_key="s", token="tok")

    def ep(profile: Profile, option: str | None, env: dict[str, str]) -> tuple[object, ...]:
        e = endpoints_from(profile, broker=None, nameserver=option, timeout_s=None,
                           json_errors=False, env=env)
        return e.nameserver, e.broker, e.timeout_s, e.access_key, e.token

    # an option (or its environment variable: click hands both over as the option)
    assert ep(dev, "http://flag:1", {})[0] == "http://flag:1"
    # the environment's keys and token beat the profile's
    assert ep(dev, None, {"TIDEMQ_ACCESS_KEY": "env", "TIDEMQ_SECRET_KEY": "x",
                          "TIDEMQ_TOKEN": "envtok"})[3:] == ("env", "envtok")
    assert ep(dev, None, {}) == ("http://dev-ns:9876", "http://dev-b:1", 3.0, "ops", "tok")
    assert ep(Profile(), None, {}) == ("http://127.0.0.1:9876", "http://127.0.0.1:10911", 10.0,
                                       "", "")


@pytest.mark.integration
def test_profile_flag_and_env_against_a_real_nameserver(
        runner: CliRunner, nameserver: ServiceProcess, no_config: Path) -> None:
    config = write(no_config / "elsewhere.toml", f"""
[profiles.live]
nameserver = "{nameserver.url}"
[profiles.dead]
nameserver = "http://127.0.0.1:1"
""")
    env = {"TIDEMQ_CONFIG": str(config)}
    live = runner.invoke(app, ["--profile", "live", "cluster", "--json"], env=env)
    assert live.exit_code == 0, live.output
    assert "brokers" in json.loads(live.stdout)
    by_env = runner.invoke(app, ["cluster", "--json"], env={**env, "TIDEMQ_PROFILE": "live"})
    assert by_env.exit_code == 0, by_env.output
    dead = runner.invoke(app, ["--profile", "dead", "cluster"], env=env)
    assert dead.exit_code == 5
    # the environment variable beats the profile, the option beats both
    over = runner.invoke(app, ["--profile", "dead", "cluster", "--json"],
                         env={**env, "TIDEMQ_NAMESERVER_URL": nameserver.url})
    assert over.exit_code == 0, over.output
    flag = runner.invoke(app, ["--profile", "dead", "--nameserver", nameserver.url, "cluster"],
                         env={**env, "TIDEMQ_NAMESERVER_URL": "http://127.0.0.1:1"})
    assert flag.exit_code == 0, flag.output


@pytest.mark.parametrize(("text", "names"), [
    ('[profiles.dev]\ntimeout = "soon"\n', "profiles.dev.timeout"),
    ('[profiles.dev]\nnameserver = "dev-ns:9876"\n', "profiles.dev.nameserver"),
    ('[profiles.dev]\nbrokr = "http://b:1"\n', "profiles.dev.brokr"),
    ('[profiles.dev]\naccess_key = "ops"\n', "profiles.dev.secret_key"),
    ('[profiles.dev\n', "not valid TOML"),
    ('default_profile = "prod"\n[profiles.dev]\n', "default_profile"),
    ('[profiles.default]\nca = "/no/such/ca.pem"\n', "profiles.default.ca"),
])
def test_bad_file_is_one_line_naming_file_and_key(runner: CliRunner, no_config: Path,
                                                  text: str, names: str) -> None:
    config = write(no_config / "tidemq" / "config.toml", text)
    result = runner.invoke(app, ["cluster"], env={"COLUMNS": "500"})
    assert result.exit_code == 2, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith(f"CONFIG: {config}: ")
    assert names in line


def test_unknown_profile_and_missing_file(runner: CliRunner, no_config: Path) -> None:
    result = runner.invoke(app, ["--json", "--profile", "nope", "cluster"])
    assert result.exit_code == 2
    error = json.loads(result.stderr)
    assert error["code"] == "CONFIG" and "no profile 'nope'" in error["message"]
    missing = runner.invoke(app, ["cluster"], env={"TIDEMQ_CONFIG": str(no_config / "no.toml")})
    assert missing.exit_code == 2
    assert "TIDEMQ_CONFIG" in missing.stderr
