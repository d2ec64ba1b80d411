"""`atropos envs`: list bundled and installed environments, one line each."""

from __future__ import annotations

import typer
from rich.table import Table

from atropos_cli.cli.common import cli_errors, console


def envs_command() -> None:
    """List bundled envs (and envs installed through the `atropos.envs` entry point) with a one-line description."""
    from atropos_cli.env.registry import list_envs

    with cli_errors():
        table = Table(show_header=True, header_style="bold", box=None)
        table.add_column("env")
        table.add_column("source")
        table.add_column("description")
        for info in list_envs():
            table.add_row(info.name, info.source, info.description)
        console.print(table)


def register(app: typer.Typer) -> None:
    app.command("envs")(envs_command)
