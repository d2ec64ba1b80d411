"""`atropos port FILE`: what an Atropos env file uses that we lack (read, not run); `--run` adds one group on the
local model."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from atropos_cli.cli.common import cli_errors, console, fail


def port_command(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="An env file written for atroposlib.", exists=True, dir_okay=False)],
    run: Annotated[
        bool,
        typer.Option(
            "--run",
            help="Also import the file and run one group on the shipped local model: the file's code runs as you, "
            "unsandboxed (only for files you trust).",
        ),
    ] = False,
) -> None:
    """Check an Atropos env file without running it: what it uses that we lack (read from its source).

    Lists each atroposlib name the file imports that we do not provide (file:line) and the features we accept
    but do not implement. With --run it then imports the file and runs one group with `--openai.server_type
    local` (the file's code runs unsandboxed); extra dotted flags (--env.*, --openai.*) pass through to that run.
    """
    from atropos_cli.compat.port import scan_env_file

    with cli_errors():
        report = scan_env_file(file)
    console.print(f"{file}: imports {len(set(report.imported))} atroposlib modules", soft_wrap=True, markup=False)
    for finding in report.missing:
        console.print(f"  {file}:{finding.line}: missing: {finding.message}", style="red", soft_wrap=True, markup=False)
    for finding in report.notes:
        console.print(f"  {file}:{finding.line}: note: {finding.message}", style="yellow", soft_wrap=True, markup=False)
    if report.missing:
        raise fail(f"{len(report.missing)} atroposlib names are not provided", hint="see README: Porting")
    console.print("  every atroposlib name it imports is provided")
    if run:
        _one_group(file, list(ctx.args))
    else:
        console.print(
            "  the file was read, not run: --run imports it and runs one group on the shipped local model "
            "(its code runs as you, unsandboxed)", soft_wrap=True, markup=False,
        )  # fmt: skip


def _one_group(file: Path, extra: list[str]) -> None:
    from atropos_cli.env.loading import load_env
    from atropos_cli.runs.process import RunPaths, prepare_output, run_process

    overrides: dict[str, dict[str, Any]] = {
        "env": {"total_steps": 1, "tokenizer_name": "atropos-tiny-arith", "use_wandb": False},
        "openai": {"server_type": "local", "model_name": "atropos-tiny-arith", "base_url": ""},
    }
    with cli_errors(), tempfile.TemporaryDirectory() as tmp:
        loaded = load_env(str(file), extra, None, overrides, mode="process")
        paths = RunPaths.for_dir(Path(tmp) / "run")
        prepare_output(paths, loaded.run_config, resume=False, overwrite=False)
        stats = asyncio.run(run_process(loaded, paths, num_groups=1, concurrency=1, skip=set()))
        if stats.counts.groups == 0:
            raise fail("the env produced no group on the local model", hint=f"see {paths.failures}")
    console.print("  one group ran on the shipped local model (atropos-tiny-arith): the env works here")


def register(app: typer.Typer) -> None:
    app.command("port", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(port_command)
