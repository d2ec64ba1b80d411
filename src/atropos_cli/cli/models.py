"""`atropos models`: the models that ship inside the package, each with its directory (a Hugging Face model
directory: transformers and TRL load it with `from_pretrained(PATH)`)."""

from __future__ import annotations

import typer

from atropos_cli.cli.common import cli_errors, console


def models_command() -> None:
    """List the shipped models and their directories (TRL/transformers: from_pretrained(PATH))."""
    from atropos_cli.resources import resolve_model_path, shipped_models

    with cli_errors():
        names = shipped_models()
        if not names:
            console.print("no shipped models in this install: reinstall atropos (its wheel carries them)")
        for name in names:
            console.print(f"{name}  {resolve_model_path(name)}", soft_wrap=True, markup=False)


def register(app: typer.Typer) -> None:
    app.command("models")(models_command)
