"""`atropos models`: the models that ship inside the package, each with its directory (a Hugging Face model
directory: transformers and TRL load it with `from_pretrained(PATH)`), then the model families atropos drives
and the path each part of a run takes for them."""

from __future__ import annotations

import typer
from rich.table import Table

from atropos_cli.cli.common import cli_errors, console


def models_command() -> None:
    """List the shipped models with their directories, and the supported model families with their paths."""
    from atropos_cli.resources import resolve_model_path, shipped_models

    with cli_errors():
        names = shipped_models()
        if not names:
            console.print("no shipped models in this install: reinstall atropos (its wheel carries them)")
        for name in names:  # TRL / transformers: from_pretrained(PATH)
            console.print(f"{name}  {resolve_model_path(name)}", soft_wrap=True, markup=False)
        console.print()
        console.print(_families_table())
        console.print(
            "Any other causal LM whose layers call transformers' attention interface runs too: `atropos train` "
            "prints the path it takes before the first step. Speeds per family: docs/models.md."
        )


def _families_table() -> Table:
    import torch
    from transformers import AutoModelForCausalLM

    from atropos_cli.families import FAMILIES, config_for
    from atropos_cli.paths import attention_line, rollout_path, trainer_attention_path

    table = Table(show_header=True, header_style="bold", box=None, title="model families", title_justify="left")
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
    from transformers import AutoModelForImageTextToText

    from atropos_cli import families_vl

    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(families_vl.config_for(next(iter(families_vl.SHAPES))))
    table.add_row(
        families_vl.VL_FAMILY,
        ", ".join(families_vl.SHAPES),
        f"{attention_line(model).removeprefix('attention: ')}; {families_vl.TRAITS}",
        rollout_path(model, cuda=True),
        trainer_attention_path(model),
    )
    return table


def register(app: typer.Typer) -> None:
    app.command("models")(models_command)
