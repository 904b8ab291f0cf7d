"""The root `tidemq` command: global options and the list of sub-commands."""

from __future__ import annotations

import inspect
from typing import Annotated

import typer

from services.cli import admin, delays, dlq, groups, messages, tx, up
from services.cli.rest import DEFAULT_BROKER_URL, DEFAULT_NAMESERVER_URL, Endpoints, parse_urls

app = typer.Typer(
    name="tidemq",
    help="tidemq: a RocketMQ-style message queue with transactional and delayed messages.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def root(
    ctx: typer.Context,
    broker: Annotated[str, typer.Option(envvar="TIDEMQ_BROKER_URL",
                                        help="Broker base URL.")] = DEFAULT_BROKER_URL,
    nameserver: Annotated[str, typer.Option(
        envvar="TIDEMQ_NAMESERVER_URL",
        help="Nameserver base URL; several comma-separated, asked in turn.")
                          ] = DEFAULT_NAMESERVER_URL,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each request.")] = 10.0,
) -> None:
    nameservers = parse_urls(nameserver) or (DEFAULT_NAMESERVER_URL,)
    ctx.obj = Endpoints(broker=broker.rstrip("/"), nameserver=nameservers[0],
                        timeout_s=timeout, nameservers=nameservers)


app.command("up")(up.up)
app.add_typer(admin.topic_app, name="topic")
app.add_typer(delays.delay_app, name="delay")
app.add_typer(tx.tx_app, name="tx")
app.add_typer(groups.group_app, name="group")
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
