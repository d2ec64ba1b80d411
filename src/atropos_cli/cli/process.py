"""`atropos process`: run an env offline into jsonl + parquet + HTML, concurrently, with progress."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn, TimeRemainingColumn
from rich.text import Text

from atropos_cli.cli.common import DottedCommand, cli_errors, console, err_console, fail

ENV_HELP = "Env: a bundled name (see `atropos envs`), an installed entry point, or a path file.py[:Class]."
DOTTED_HELP = (
    "Atropos-style dotted flags are accepted too: --env.<field> VALUE and --openai.<field> VALUE "
    "(e.g. --env.group_size 8 --openai.base_url http://127.0.0.1:9001/v1)."
)


class RateColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        failed = task.fields.get("failed", 0)
        rate = f"{speed:.2f} groups/s" if speed else "-- groups/s"
        return Text(f"{rate}  {failed} rollouts failed", style="progress.data.speed")


def plain_overrides(**values: Any) -> dict[str, dict[str, Any]]:
    """Map plain options (`--group-size`) onto the dotted namespaces (`env.group_size`); None = not given."""
    mapping = {
        "group_size": ("env", "group_size"),
        "num_groups": ("env", "total_steps"),
        "seed": ("env", "seed"),
        "base_url": ("openai", "base_url"),
        "model": ("openai", "model_name"),
        "api_key": ("openai", "api_key"),
    }
    out: dict[str, dict[str, Any]] = {"env": {}, "openai": {}}
    for key, value in values.items():
        if value is not None:
            namespace, field = mapping[key]
            out[namespace][field] = value
    return out


def process_command(
    ctx: typer.Context,
    env: Annotated[str, typer.Argument(help=ENV_HELP)] = "arithmetic",
    out: Annotated[Path | None, typer.Option("--out", help="Run directory (default: runs/<env>).")] = None,
    num_groups: Annotated[int | None, typer.Option(min=1, help="Groups to collect (= --env.total_steps).")] = None,
    group_size: Annotated[int | None, typer.Option(help="Rollouts per group (= --env.group_size).")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Groups in flight at once.")] = 32,
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible server URL (= --openai.base_url).")] = None,
    model: Annotated[str | None, typer.Option(help="Model name, or a local model dir (= --openai.model_name).")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="OPENAI_API_KEY", help="API key (= --openai.api_key).")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of the item stream and of sampling (= --env.seed).")] = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="YAML config (Atropos layout: env:, openai:).")
    ] = None,
    resume: Annotated[bool, typer.Option(help="Continue an interrupted run in --out.")] = False,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing run in --out.")] = False,
) -> None:
    """Run ENV offline: collect scored groups into jsonl + parquet + an HTML viewer.

    With no server flags, ENV runs on the local backend with the shipped model atropos-tiny-arith.
    """
    from atropos_cli.env.loading import load_env, uses_default_local_model
    from atropos_cli.runs.process import RunPaths, default_out_dir, prepare_output

    with cli_errors():
        overrides = plain_overrides(
            group_size=group_size,
            num_groups=num_groups,
            seed=seed,
            base_url=base_url,
            model=model,
            api_key=api_key,
        )
        loaded = load_env(env, list(ctx.args), str(config) if config else None, overrides, mode="process")
        jsonl_path = loaded.env_config.data_path_to_save_groups
        if out is not None:
            paths = RunPaths.for_dir(out)
        elif jsonl_path:
            paths = RunPaths.for_jsonl(Path(jsonl_path))
        else:
            paths = RunPaths.for_dir(default_out_dir(env))
        resumed = prepare_output(paths, loaded.run_config, resume=resume, overwrite=overwrite)
        warn_bad_lines(resumed.bad_lines)
        if uses_default_local_model(loaded.servers):
            err_console.print("no --openai.base_url given: using the local backend with atropos-tiny-arith")
        total = loaded.env_config.total_steps
        stats = _run_with_progress(loaded, paths, total, concurrency, resumed.skip)
    _summarise(stats, paths)


def warn_bad_lines(
    bad_lines: list[Any], again: str = "a group on such a line is collected again", shown: int = 3
) -> None:
    """--resume met unreadable lines: say where, and that they stay in the file (their items run again)."""
    if not bad_lines:
        return
    err_console.print(f"warning: {len(bad_lines)} unreadable line(s) in the run; left in place, {again}:")
    for bad in bad_lines[:shown]:
        err_console.print(f"  {bad.location}: {bad.reason}", soft_wrap=True, markup=False)
    if len(bad_lines) > shown:
        err_console.print(f"  ... and {len(bad_lines) - shown} more")


def _run_with_progress(loaded: Any, paths: Any, total: int, concurrency: int, skip: set[int]) -> Any:
    from atropos_cli.runs.process import run_process

    columns = [
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        RateColumn(),
        TimeRemainingColumn(),
    ]
    with Progress(*columns, console=err_console, transient=False) as progress:
        task = progress.add_task(loaded.env.name, total=total, completed=len(skip), failed=0)

        def on_progress(stats: Any) -> None:
            counts = stats.counts
            done = len(skip) + counts.groups + counts.failed_groups + counts.filtered_groups
            progress.update(task, completed=done, failed=counts.failed_rollouts)

        return asyncio.run(
            run_process(loaded, paths, num_groups=total, concurrency=concurrency, skip=skip, on_progress=on_progress)
        )


def _summarise(stats: Any, paths: Any) -> None:
    from atropos_cli.runs.process import process_report

    report = process_report(stats, paths)
    counts = stats.counts
    console.print(report.summary, soft_wrap=True)
    if report.note:
        err_console.print(f"note: {report.note}", soft_wrap=True, markup=False)
    if counts.tokens_missing:
        err_console.print(
            f"note: {counts.tokens_missing} groups have no token ids (no tokenizer, and the server returned none); "
            "they are fine for viewing and sft-gen, but posting to an API or training needs "
            "--env.tokenizer_name"
        )
    if stats.interrupted:
        raise fail("interrupted: finished groups are saved", hint="continue with --resume", code=130)
    if report.error:
        raise fail(report.error, hint="check the server and the env")


def register(app: typer.Typer) -> None:
    app.command(
        "process",
        cls=DottedCommand,
        epilog=DOTTED_HELP,
    )(process_command)
