"""What every CLI command shares: consoles, the endpoints chosen by global options, REST calls.

The CLI talks to the services with plain httpx (not the SDK). A server error is shown as
``CODE: message`` on stderr (with ``--json``: ``{"code": ..., "message": ...}``) and the command
exits with the status ``tidemq_server.cli.errors.EXIT_CODES`` gives that code.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, ParamSpec, TypeVar
from urllib.parse import quote

import httpx
import typer
from rich.console import Console
from tidemq import ConfigurationError
from tidemq._constants import TLS_CA_ENV

from tidemq_server.cli.errors import exit_code_for, print_json_error, split_code
from tidemq_server.common.auth.client import service_auth, signing_auth
from tidemq_server.common.constants import BROKER_PORT, NAMESERVER_PORT, TOKEN_HEADER
from tidemq_server.common.tls import client_context

#: Width of the CLI's output when it is not a terminal (a pipe, a file, a supervisor's log) and
#: COLUMNS does not say: wide, so a table never cuts a name short ("nameserver…").
PIPED_WIDTH = 240


def _console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    piped = not stream.isatty() and not os.environ.get("COLUMNS", "").isdigit()
    return Console(stderr=stderr, width=PIPED_WIDTH if piped else None)


console = _console()
err_console = _console(stderr=True)

DEFAULT_BROKER_URL = f"http://127.0.0.1:{BROKER_PORT}"
DEFAULT_NAMESERVER_URL = f"http://127.0.0.1:{NAMESERVER_PORT}"
DEFAULT_TIMEOUT_S = 10.0  # seconds to wait for each request (--timeout, TIDEMQ_TIMEOUT)

# The services' TOPIC_NOT_FOUND messages end with the REST call that creates the topic; on the
# command line the hint names the command instead.
_CREATE_CALL = re.compile(r"PUT /v1/topics/([^\s)]+)")

#: The ``--json`` option of the commands that show one REST answer.
JsonOption = Annotated[bool, typer.Option("--json", help="Print the raw JSON answer.")]

P = ParamSpec("P")
R = TypeVar("R")


class CliError(Exception):
    """A failure to report in one line and exit with ``exit_code``.

    ``message`` reads ``CODE: detail``; the code (``FAILED`` when the message has none, or the
    ``code`` given) chooses the exit status unless ``exit_code`` is given
    (``tidemq_server.cli.errors``)."""

    def __init__(self, message: str, exit_code: int | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        parsed, detail = split_code(message)
        self.code = code or parsed
        self.detail = detail if code is None or code == parsed else message
        self.exit_code = exit_code if exit_code is not None else exit_code_for(self.code)


def json_errors_wanted(json_out: object = False, ctx: object = None) -> bool:
    """True when errors go out as JSON: the command's ``--json`` or the global one."""
    if json_out is True:
        return True
    find = getattr(ctx, "find_object", None)  # the command's click context, when it has one
    ep = find(Endpoints) if callable(find) else None
    return ep is not None and ep.json_errors


def report(exc: CliError, json_out: bool) -> typer.Exit:
    """Show ``exc`` on stderr (one red line, or one JSON object) and answer its ``typer.Exit``."""
    if json_out:
        print_json_error(exc.code, exc.detail)
    else:
        err_console.print(exc.message, style="bold red", markup=False, highlight=False)
    return typer.Exit(exc.exit_code)


def reports_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorate a command: a ``CliError`` becomes one line on stderr (red text, or JSON with
    ``--json``) and its exit code."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            try:
                return fn(*args, **kwargs)
            except ConfigurationError as exc:  # e.g. a CA bundle that does not load
                raise CliError(f"CONFIG: {exc}") from None
        except CliError as exc:
            wanted = json_errors_wanted(kwargs.get("json_out"), kwargs.get("ctx"))
            raise report(exc, wanted) from None

    return wrapper


@dataclass(frozen=True)
class Endpoints:
    """Where the services are (global options ``--broker`` and ``--nameserver``).

    ``--nameserver`` may list several URLs, comma-separated: cluster-wide commands ask them in
    turn until one answers (``nameserver`` is the first)."""

    broker: str = DEFAULT_BROKER_URL
    nameserver: str = DEFAULT_NAMESERVER_URL
    timeout_s: float = DEFAULT_TIMEOUT_S
    nameservers: tuple[str, ...] = ()  # every URL given; () = just ``nameserver``
    json_errors: bool = False  # global --json: errors as JSON on stderr
    access_key: str = ""  # sign with this account (a profile's); "" = TIDEMQ_ACCESS_KEY's
    secret_key: str = ""
    token: str = ""  # cluster token sent in X-Tidemq-Token ("" = none)

    def auth(self) -> httpx.Auth | None:
        """The account requests are signed with: this one's keys, else the environment's."""
        return signing_auth(self.access_key, self.secret_key) or service_auth()

    def headers(self) -> dict[str, str]:
        return {TOKEN_HEADER: self.token} if self.token else {}

    def client(self, timeout_s: float | None = None) -> httpx.Client:
        return httpx.Client(timeout=timeout_s or self.timeout_s, verify=client_context(),
                            auth=self.auth(), headers=self.headers())

    def nameserver_urls(self) -> tuple[str, ...]:
        return self.nameservers or (self.nameserver,)


def parse_urls(value: str) -> tuple[str, ...]:
    """Comma-separated base URLs, without trailing slashes."""
    return tuple(u.strip().rstrip("/") for u in value.split(",") if u.strip())


def cluster_view(client: httpx.Client, ep: Endpoints) -> tuple[str, dict[str, Any]]:
    """``GET /v1/cluster`` from the first nameserver that answers: (its URL, the answer)."""
    failures: list[str] = []
    for url in ep.nameserver_urls():
        try:
            resp = client.get(f"{url}/v1/cluster")
        except httpx.HTTPError as exc:
            hint = tls_hint(url, exc)
            failures.append(f"{url} ({hint or str(exc) or type(exc).__name__})")
            continue
        return url, answer(resp)
    raise CliError(f"UNAVAILABLE: cannot reach any nameserver: {'; '.join(failures)}; is "
                   "tidemq running? Start it with `tidemq up` or point --nameserver at it")


def endpoints(ctx: typer.Context) -> Endpoints:
    found = ctx.find_object(Endpoints)
    return found if found is not None else Endpoints()


def segment(value: str) -> str:
    """Quote a topic, group or id for use as one URL path segment (``%RETRY%g`` included)."""
    return quote(value, safe="")


def answer(resp: httpx.Response) -> Any:
    """The decoded JSON of a successful answer, or a CliError showing ``CODE: message``."""
    if resp.status_code < 400:
        return resp.json() if resp.content else {}
    try:
        body = resp.json()
        code, message = body["code"], body["message"]
    except (ValueError, KeyError, TypeError):
        code, message = f"HTTP_{resp.status_code}", resp.text.strip()[:500] or resp.reason_phrase
    if code == "TOPIC_NOT_FOUND":
        message = _CREATE_CALL.sub(r"`tidemq topic create \1`", str(message))
    raise CliError(f"{code}: {message}")


def tls_hint(url: str, exc: httpx.HTTPError) -> str:
    """What to do about a TLS mismatch behind ``exc`` ("" when it is not one)."""
    if isinstance(exc, httpx.RemoteProtocolError) and url.startswith("http://"):
        return ("closed the connection without an answer: if that port serves TLS, "
                "use https://")
    if "CERTIFICATE_VERIFY_FAILED" in str(exc):
        return f"cannot verify the TLS certificate: set {TLS_CA_ENV} to the CA that signed it"
    return ""


def unreachable(url: str, exc: httpx.HTTPError) -> CliError:
    detail = str(exc) or type(exc).__name__
    hint = tls_hint(url, exc)
    if hint:
        return CliError(f"UNAVAILABLE: {url} {hint} ({detail})")
    if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
        return CliError(f"TIMEOUT: no answer from {url} in time ({detail}); a longer "
                        "--timeout (TIDEMQ_TIMEOUT) may help")
    return CliError(f"UNAVAILABLE: cannot reach {url} ({detail}); is tidemq running? "
                    "Start it with `tidemq up` or point --broker/--nameserver at it")


def call(client: httpx.Client, method: str, url: str, **kwargs: Any) -> Any:
    """One REST call: decoded JSON on success, CliError on a server error or no connection."""
    try:
        resp = client.request(method, url, **kwargs)
    except httpx.HTTPError as exc:
        raise unreachable(url, exc) from exc
    return answer(resp)


def request(ep: Endpoints, method: str, url: str, **kwargs: Any) -> Any:
    """``call`` on a client of its own, for a command that makes one REST call."""
    with ep.client() as client:
        return call(client, method, url, **kwargs)


def printed_json(payload: Any, json_out: bool) -> bool:
    """With ``--json``, print ``payload`` and answer True: the command shows nothing else."""
    if json_out:
        print_json(payload)
    return json_out


def print_json(payload: Any) -> None:
    """One JSON document per line, for scripts (``--json``)."""
    text = json.dumps(payload, ensure_ascii=False)
    if console.is_terminal:
        console.print_json(text)
    else:
        print(text, flush=True)
