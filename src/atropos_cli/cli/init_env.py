"""`atropos init-env NAME`: scaffold a working env file and its test."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from atropos_cli.cli.common import cli_errors, console


def init_env_command(
    name: Annotated[str, typer.Argument(help="Env name: a Python module name such as my_task.")],
    out: Annotated[Path, typer.Option("--out", help="Directory to write NAME.py and test_NAME.py into.")] = Path("."),
    overwrite: Annotated[bool, typer.Option(help="Replace existing files.")] = False,
) -> None:
    """Write NAME.py (a declarative env: items, prompt, reward) and test_NAME.py; both pass as written."""
    from atropos_cli.env.scaffold import scaffold_env

    with cli_errors():
        env_file, test_file = scaffold_env(name, out, overwrite=overwrite)
    console.print(f"wrote {env_file} and {test_file}")
    console.print(f"next: {_test_command(test_file)}  ·  atropos process {env_file} --num-groups 8", soft_wrap=True)


def _test_command(test_file: Path) -> str:
    """How to run the scaffolded test here: pytest is a dev tool, not in atropos' own extras (`.[local,plot]`),
    so where it is missing the line says what to install first."""
    from importlib.util import find_spec

    run = f"pytest {test_file}"
    return run if find_spec("pytest") is not None else f"pip install pytest && {run}"


def register(app: typer.Typer) -> None:
    app.command("init-env")(init_env_command)
