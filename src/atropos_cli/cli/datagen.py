"""`atropos sft-gen` and `atropos dpo-gen`: rejection sampling from rollout files (or a live API) into datasets.

Flow: inputs (formats.reader.iter_groups over run dirs / jsonl / parquet / globs, or api.client.iter_api_groups)
──► datagen.select_sft / select_dpo ──► formats.dataset (OUT/train.jsonl, OUT/train.parquet, OUT/README.md)
──► a summary table of groups read, rows written and rollouts dropped by reason.

The options are generated from the models in datagen/options.py and api/client.py (one default, one help text
per setting); both commands share them, so `--tasks-per-step` sets the registered batch size of either.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.table import Table

from atropos_cli.cli.common import cli_errors, console, err_console
from atropos_cli.cli.options import ModelOptions, with_options
from atropos_cli.errors import UsageError

INPUTS_HELP = "Run dirs, groups.jsonl / groups.parquet files or globs (several at once)."
MAX_WARNINGS = 10

Inputs = Annotated[list[str] | None, typer.Argument(help=INPUTS_HELP, show_default=False)]
Out = Annotated[Path | None, typer.Option("--out", help="Output directory (train.jsonl, train.parquet, README.md).")]


def _specs(kind: Literal["sft", "dpo"]) -> tuple[ModelOptions, ModelOptions, ModelOptions]:
    """The options of one command, from its models: selection, output, and the --api-url source."""
    from atropos_cli.api.client import ApiSourceOptions
    from atropos_cli.datagen.options import DpoOptions, DpoOutput, SftOptions, SftOutput

    select = ModelOptions(SftOptions if kind == "sft" else DpoOptions, panel="Selection")
    output = ModelOptions(SftOutput if kind == "sft" else DpoOutput, panel="Output")
    api = ModelOptions(
        ApiSourceOptions,
        exclude=("max_token_len",),  # registered from the selection's --max-token-len
        flags={"url": "--api-url"},
        envvars={"api_key": "ATROPOS_API_KEY"},
        panel="Live API source",
    )
    return select, output, api


SFT_OPTIONS, DPO_OPTIONS = _specs("sft"), _specs("dpo")


@with_options(*SFT_OPTIONS)
def sft_gen_command(ctx: typer.Context, inputs: Inputs = None, out: Out = None, **settings: Any) -> None:
    """Build an SFT dataset: the best rollouts of each group (rejection sampling), TRL-ready."""
    with cli_errors():
        _run(_job(ctx, "sft", SFT_OPTIONS, inputs, out, settings))


@with_options(*DPO_OPTIONS)
def dpo_gen_command(ctx: typer.Context, inputs: Inputs = None, out: Out = None, **settings: Any) -> None:
    """Build a DPO dataset: chosen/rejected pairs from each group's score spread, TRL-ready."""
    with cli_errors():
        _run(_job(ctx, "dpo", DPO_OPTIONS, inputs, out, settings))


def _job(
    ctx: typer.Context,
    kind: Literal["sft", "dpo"],
    specs: tuple[ModelOptions, ModelOptions, ModelOptions],
    inputs: list[str] | None,
    out: Path | None,
    settings: dict[str, Any],
) -> _Job:
    from atropos_cli.config import validate_model

    select, output, api = specs
    options = validate_model(select.model, select.given(ctx, settings), kind)
    written = validate_model(output.model, output.given(ctx, settings), kind)
    if written.append_to_previous and written.overwrite:
        raise UsageError("--append-to-previous and --overwrite cannot be used together", hint="pick one")
    source = api.given(ctx, settings)
    if "url" not in source:
        if source.get("reset"):
            raise UsageError("--reset only applies to --api-url", hint="drop --reset, or pass --api-url URL")
        return _Job(kind, inputs or [], out, options, written, None)
    source["max_token_len"] = options.max_token_len or api.model.model_fields["max_token_len"].default
    return _Job(kind, inputs or [], out, options, written, validate_model(api.model, source, "api"))


class _BadLines:
    """Counts skipped records and prints the first few as `file:line: reason` warnings."""

    def __init__(self, stats: Any) -> None:
        self.stats = stats
        self.count = 0

    def __call__(self, location: Any, reason: str | None = None) -> None:
        if reason is None:  # readers' BadRecord(location, reason)
            location, reason = location.location, location.reason
        self.count += 1
        self.stats.bad_records += 1
        if self.count <= MAX_WARNINGS:
            err_console.print(f"[yellow]warning:[/] skipped {location}: {reason}", soft_wrap=True)
        elif self.count == MAX_WARNINGS + 1:
            err_console.print("[yellow]warning:[/] more bad records skipped (counted in the summary)")


def _groups(inputs: list[str], api: Any, strict: bool, bad: _BadLines) -> Iterator[Any]:
    if inputs:
        from atropos_cli.formats.reader import expand_inputs, iter_groups

        yield from iter_groups(expand_inputs(inputs), strict=strict, on_bad=None if strict else bad)
    if api is not None:
        from atropos_cli.api.client import iter_api_groups

        yield from iter_api_groups(api, on_bad=None if strict else bad)


@dataclass
class _Job:
    """Everything one sft-gen / dpo-gen run was asked to do (the two commands differ only in kind and options)."""

    kind: Literal["sft", "dpo"]
    inputs: list[str]
    out: Path | None
    options: Any  # SftOptions | DpoOptions
    output: Any  # SftOutput | DpoOutput
    api: Any  # ApiSourceOptions | None

    @property
    def sources(self) -> list[str]:
        return self.inputs + ([self.api.url] if self.api is not None else [])


def _run(job: _Job) -> None:
    from atropos_cli.datagen.select import DatagenStats, select_dpo, select_sft
    from atropos_cli.formats.dataset import existing_keys, row_formatter

    out = job.output
    if not job.inputs and job.api is None:
        raise UsageError("no input given", hint="pass run dirs / rollout files, or --api-url URL")
    if job.out is None and not out.dry_run:
        raise UsageError("--out is required", hint="pass --out DIR (or --dry-run to only print the summary)")
    formatter = row_formatter(job.kind, out.format, out.save_messages)  # checks --format before any work
    tokenizer = _load_tokenizer(out.tokenizer)
    stats = DatagenStats()
    seen = None
    if out.mode == "append" and job.options.dedupe and job.out is not None:
        seen = existing_keys(job.out, job.kind, out.format, out.save_messages)
    select = select_sft if job.kind == "sft" else select_dpo
    groups = _groups(job.inputs, job.api, out.strict, _BadLines(stats))
    rows = select(groups, job.options, stats, tokenizer=tokenizer, seen=seen)
    total = None
    if out.dry_run:
        _consume(rows, stats)
    else:
        total = _write(job, (formatter(row) for row in rows), stats)
    _summary(job.kind, stats, job.out, total, out.dry_run)


def _load_tokenizer(name: str | None) -> Any:
    if name is None:
        return None
    from atropos_cli.inference.tokenizer import load_tokenizer

    return load_tokenizer(name)


def _consume(rows: Iterable[Any], stats: Any) -> None:
    with _Progress(stats) as tick:
        for _ in rows:
            tick()


def _write(job: _Job, records: Iterable[dict[str, Any]], stats: Any) -> int:
    from atropos_cli.formats.dataset import DatasetWriter, render_card, schema_for

    assert job.out is not None
    out = job.output
    schema = schema_for(job.kind, out.format, out.save_messages)
    with DatasetWriter(job.out, schema, out.mode) as writer, _Progress(stats) as tick:
        for record in records:
            writer.write(record)
            tick()
    settings = {"format": out.format, "save_messages": out.save_messages, **job.options.model_dump()}
    card = render_card(
        kind=job.kind,
        fmt=out.format,
        stats=stats,
        options=settings,
        sources=job.sources,
        total_rows=writer.total_rows,
        columns=schema.names,
    )
    (job.out / "README.md").write_text(card, encoding="utf-8")
    return writer.total_rows


class _Progress:
    """A live line `N groups read, M rows written` on stderr, refreshed every few hundred rows."""

    def __init__(self, stats: Any) -> None:
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.stats = stats
        self.count = 0
        self.bar = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err_console, transient=True
        )
        self.task = self.bar.add_task("reading groups")

    def __enter__(self) -> Any:
        self.bar.__enter__()
        return self.tick

    def tick(self) -> None:
        self.count += 1
        if self.count % 500 == 0:
            s = self.stats
            self.bar.update(self.task, description=f"{s.groups_read} groups read, {s.rows_written} rows written")

    def __exit__(self, *exc: object) -> None:
        self.bar.__exit__(*exc)  # type: ignore[arg-type]


def _summary(kind: str, stats: Any, out: Path | None, total: int | None, dry_run: bool) -> None:
    unit = "rows" if kind == "sft" else "pairs"
    table = Table(title=f"{kind}-gen summary", box=None)
    table.add_column("", style="bold")
    table.add_column("count", justify="right")
    table.add_row("groups read", str(stats.groups_read))
    table.add_row("rollouts read", str(stats.rollouts_read))
    table.add_row(f"{unit} written" if not dry_run else f"{unit} selected", str(stats.rows_written))
    for label, count in stats.breakdown(kind):
        table.add_row(label, str(count))
    table.add_row("skipped: bad records", str(stats.bad_records))
    console.print(table)
    if dry_run:
        console.print("dry run: nothing written")
    else:
        console.print(f"wrote {stats.rows_written} {unit} to {out} ({total} in the dataset)", soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("sft-gen")(sft_gen_command)
    app.command("dpo-gen")(dpo_gen_command)
