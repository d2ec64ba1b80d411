"""The `atropos` Typer app: registers each command module. Imports nothing heavy, so `--help` is instant."""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="atropos",
    help="Rollouts, scored datasets and a GRPO loop for RL with LLMs: offline-first.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from atropos_cli import __version__

        typer.echo(f"atropos {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """Rollouts, scored datasets and a GRPO loop for RL with LLMs: offline-first."""


# Each module exposes `register(app)`; order is the order of `atropos --help`.
COMMAND_MODULES = (
    "atropos_cli.cli.process",
    "atropos_cli.cli.evaluate",
    "atropos_cli.cli.init_env",
    "atropos_cli.cli.view",
    "atropos_cli.cli.envs",
    "atropos_cli.cli.api",
    "atropos_cli.cli.serve",
    "atropos_cli.cli.datagen",
    "atropos_cli.cli.train",
    "atropos_cli.cli.inference",
)


def _register_all() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(app)


_register_all()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
