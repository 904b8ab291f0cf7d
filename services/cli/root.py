"""The root `tidemq` command: global options and the list of sub-commands."""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import tidemq
import typer
from tidemq._constants import TLS_CA_ENV
from tidemq.protocol.signing import ACCESS_KEY_ENV, SECRET_KEY_ENV

from tidemq_server.cli import admin, brokers, delays, dlq, groups, messages, tx, up
from tidemq_server.cli.config import (
    BROKER_URL_ENV,
    CONFIG_ENV,
    NAMESERVER_URL_ENV,
    PROFILE_ENV,
    TIMEOUT_ENV,
    TOKEN_ENV,
    ConfigError,
    Profile,
    load_profile,
)
from tidemq_server.cli.errors import EXIT_HELP
from tidemq_server.cli.rest import (
    DEFAULT_BROKER_URL,
    DEFAULT_NAMESERVER_URL,
    DEFAULT_TIMEOUT_S,
    CliError,
    Endpoints,
    parse_urls,
    report,
)
from tidemq_server.common.tls import use_ca_bundle

app = typer.Typer(
    name="tidemq",
    help="tidemq: a RocketMQ-style message queue with transactional and delayed messages.",
    epilog=f"Settings come from the option, else its environment variable, else the profile "
           f"(--profile, {PROFILE_ENV}) of the settings file ({CONFIG_ENV}, default "
           f"$XDG_CONFIG_HOME/tidemq/config.toml), else the default. {EXIT_HELP}",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


def show_version(value: bool) -> None:
    if value:
        print(f"tidemq {tidemq.__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    broker: Annotated[str | None, typer.Option(
        envvar=BROKER_URL_ENV, show_default=False,
        help=f"Broker base URL [default: the profile's, else {DEFAULT_BROKER_URL}].")] = None,
    nameserver: Annotated[str | None, typer.Option(
        envvar=NAMESERVER_URL_ENV, show_default=False,
        help="Nameserver base URL; several comma-separated, asked in turn [default: the "
             f"profile's, else {DEFAULT_NAMESERVER_URL}].")] = None,
    timeout: Annotated[float | None, typer.Option(
        envvar=TIMEOUT_ENV, min=0.001, show_default=False,
        help="Seconds to wait for each request [default: the profile's, else "
             f"{DEFAULT_TIMEOUT_S:g}].")] = None,
    profile: Annotated[str | None, typer.Option(
        envvar=PROFILE_ENV, show_default=False,
        help="Profile of the settings file to use (a cluster's URLs, keys, CA, timeout).")
                       ] = None,
    json_errors: Annotated[bool, typer.Option(
        "--json", help="Errors as one JSON object on stderr: {\"code\", \"message\"}.")
                           ] = False,
    version: Annotated[bool, typer.Option(
        "--version", "-V", callback=show_version, is_eager=True,
        help="Print the version and exit.")] = False,
) -> None:
    try:
        ctx.obj = endpoints_from(load_profile(profile), broker=broker, nameserver=nameserver,
                                 timeout_s=timeout, json_errors=json_errors, env=os.environ)
    except ConfigError as exc:
        raise report(CliError(f"{exc.code}: {exc}"), json_errors) from None


def endpoints_from(chosen: Profile, *, broker: str | None, nameserver: str | None,
                   timeout_s: float | None, json_errors: bool,
                   env: Mapping[str, str]) -> Endpoints:
    """The endpoints by precedence: option or environment variable (given here, or read from
    ``env``), then the profile, then the default."""
    nameservers = (parse_urls(nameserver) if nameserver is not None else ()) \
        or chosen.nameservers or (DEFAULT_NAMESERVER_URL,)
    broker_url = broker if broker is not None else chosen.broker or DEFAULT_BROKER_URL
    access_key, secret_key = env.get(ACCESS_KEY_ENV, ""), env.get(SECRET_KEY_ENV, "")
    if not (access_key and secret_key):
        access_key, secret_key = chosen.access_key, chosen.secret_key
    if chosen.ca and not env.get(TLS_CA_ENV):
        if not Path(chosen.ca).is_file():
            raise ConfigError(f"{chosen.source}: profiles.{chosen.name}.ca: no such file "
                              f"{chosen.ca}")
        use_ca_bundle(chosen.ca)
    return Endpoints(broker=broker_url.rstrip("/"), nameserver=nameservers[0],
                     timeout_s=timeout_s or chosen.timeout_s or DEFAULT_TIMEOUT_S,
                     nameservers=nameservers, json_errors=json_errors,
                     access_key=access_key, secret_key=secret_key,
                     token=env.get(TOKEN_ENV, "") or chosen.token)


@app.command("version")
def version_command() -> None:
    """Print the version."""
    show_version(True)


app.command("up")(up.up)
app.add_typer(admin.topic_app, name="topic")
app.add_typer(delays.delay_app, name="delay")
app.add_typer(tx.tx_app, name="tx")
app.add_typer(groups.group_app, name="group")
app.add_typer(brokers.broker_app, name="broker")
app.add_typer(dlq.dlq_app, name="dlq")
app.command("send")(messages.send)
app.command("consume")(messages.consume)
app.command("query")(messages.query)
app.command("cluster")(admin.cluster)
app.command("bench", context_settings={"allow_extra_args": True,
                                       "ignore_unknown_options": True})(admin.bench)


def _first_paragraph(text: str | None) -> str | None:
    """A help text's first paragraph on one line (docstrings wrap it at 100 columns)."""
    if not text:
        return None
    return " ".join(inspect.cleandoc(text).split("\n\n")[0].split())


def one_line_help(typer_app: typer.Typer) -> None:
    """Give every command and group a one-line ``short_help``: the lists of ``--help`` keep a
    docstring's line breaks in rich mode, so sentences broke in the middle."""
    for command in typer_app.registered_commands:
        if command.short_help is None:
            command.short_help = _first_paragraph(command.help or inspect.getdoc(
                command.callback))
    for group in typer_app.registered_groups:
        sub = group.typer_instance
        if group.short_help is None and sub is not None:
            group.short_help = _first_paragraph(group.help or sub.info.help)
        if sub is not None:
            one_line_help(sub)


one_line_help(app)
