"""`atropos models`: the model families atropos drives, and the path each part takes for them."""

from __future__ import annotations

import typer
from rich.table import Table

from atropos_cli.cli.common import cli_errors, console


def models_command() -> None:
    """List the supported model families, their published shapes and the path rollouts and training take."""
    with cli_errors():
        import torch
        from transformers import AutoModelForCausalLM

        from atropos_cli.families import FAMILIES, config_for
        from atropos_cli.paths import attention_line, rollout_path, trainer_attention_path

        table = Table(show_header=True, header_style="bold", box=None)
        for column in ("family", "published shapes", "attention", "rollouts on CUDA", "training on CUDA"):
            table.add_column(column, overflow="fold")
        for family in FAMILIES.values():
            shape = next(iter(family.shapes))
            with torch.device("meta"):  # structure only: no weights are made
                model = AutoModelForCausalLM.from_config(config_for(shape))
            table.add_row(
                family.name,
                ", ".join(family.shapes),
                attention_line(model).removeprefix("attention: "),
                rollout_path(model, cuda=True),
                trainer_attention_path(model),
            )
        console.print(table)
        console.print(
            "Any other causal LM whose layers call transformers' attention interface runs too: `atropos train` "
            "prints the path it takes before the first step. Speeds per family: docs/models.md."
        )


def register(app: typer.Typer) -> None:
    app.command("models")(models_command)
