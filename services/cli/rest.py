"""What every CLI command shares: consoles, the endpoints chosen by global options, REST calls.

The CLI talks to the services with plain httpx (not the SDK). A server error is shown as
``CODE: message`` on stderr and the command exits with status 1.
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
from tidemq._constants import TLS_CA_ENV

from services.common.auth.client import service_auth
from services.common.constants import BROKER_PORT, NAMESERVER_PORT
from services.common.tls import client_context

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

# The services' TOPIC_NOT_FOUND messages end with the REST call that creates the topic; on the
# command line the hint names the command instead.
_CREATE_CALL = re.compile(r"PUT /v1/topics/([^\s)]+)")

#: The ``--json`` option of the commands that show one REST answer.
JsonOption = Annotated[bool, typer.Option("--json", help="Print the raw JSON answer.")]

P = ParamSpec("P")
R = TypeVar("R")


class CliError(Exception):
    """A failure to report in one line and exit with ``exit_code``."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


def reports_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorate a command: a ``CliError`` becomes one red line on stderr and its exit code."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except CliError as exc:
            err_console.print(exc.message, style="bold red", markup=False, highlight=False)
            raise typer.Exit(exc.exit_code) from None

    return wrapper


@dataclass(frozen=True)
class Endpoints:
    """Where the services are (global options ``--broker`` and ``--nameserver``).

    ``--nameserver`` may list several URLs, comma-separated: cluster-wide commands ask them in
    turn until one answers (``nameserver`` is the first)."""

    broker: str = DEFAULT_BROKER_URL
    nameserver: str = DEFAULT_NAMESERVER_URL
    timeout_s: float = 10.0
    nameservers: tuple[str, ...] = ()  # every URL given; () = just ``nameserver``

    def client(self, timeout_s: float | None = None) -> httpx.Client:
        return httpx.Client(timeout=timeout_s or self.timeout_s, verify=client_context(),
                            auth=service_auth())

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
