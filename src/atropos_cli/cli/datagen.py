"""`atropos sft-gen` and `atropos dpo-gen`: rejection sampling from rollout files (or a live API) into datasets.

Flow: inputs (readers.iter_groups over run dirs / jsonl / parquet / globs, or api.client.iter_api_groups)
──► datagen.select_sft / select_dpo ──► formats.dataset (OUT/train.jsonl, OUT/train.parquet, OUT/README.md)
──► a summary table of groups read, rows written and rollouts dropped by reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.table import Table

from atropos_cli.cli.common import cli_errors, console, err_console, fail

INPUTS_HELP = "Run dirs, groups.jsonl / groups.parquet files or globs (several at once)."
MAX_WARNINGS = 10

Inputs = Annotated[list[str] | None, typer.Argument(help=INPUTS_HELP, show_default=False)]
Out = Annotated[Path | None, typer.Option("--out", help="Output directory (train.jsonl, train.parquet, README.md).")]
AllowNegative = Annotated[
    bool, typer.Option("--allow-negative-scores", help="Keep rollouts with score <= 0 (Atropos' flag).")
]
MinScore = Annotated[float | None, typer.Option(help="Drop rollouts scoring below this.")]
MaxTokenLen = Annotated[
    int | None,
    typer.Option(help="Drop rollouts with more token ids than this (groups with tokens); registered with --api-url."),
]
MaxChars = Annotated[int | None, typer.Option(help="Drop rollouts whose prompt+completion text is longer.")]
Dedupe = Annotated[bool, typer.Option(help="Drop repeats of an identical prompt+completion (pair for DPO).")]
NumSeqs = Annotated[int | None, typer.Option(help="Stop after writing this many rows (default: all).")]
Append = Annotated[bool, typer.Option("--append-to-previous", help="Add rows to an existing dataset in --out.")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Replace an existing dataset in --out.")]
Tokenizer = Annotated[
    str | None, typer.Option(help="Tokenizer (model dir or shipped model) to decode groups that carry only tokens.")
]
SaveMessages = Annotated[
    bool,
    typer.Option(
        "--save-messages", help="--format atropos: write messages instead of prefix/completion text (Atropos' flag)."
    ),
]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Select and print the summary without writing anything.")]
Strict = Annotated[
    bool, typer.Option("--strict", help="Make a corrupt line fatal (default: report file:line and skip it).")
]
ApiUrl = Annotated[str | None, typer.Option(help="Pull groups from a live trajectory API as a trainer would.")]
ApiKey = Annotated[str | None, typer.Option(envvar="ATROPOS_API_KEY", help="Key for --api-url.")]
Reset = Annotated[bool, typer.Option("--reset", help="With --api-url: wipe the API's queue first (GET /reset_data).")]
IdleTimeout = Annotated[float, typer.Option(help="With --api-url: stop after this many seconds without data.")]
GroupSize = Annotated[
    int, typer.Option(help="With --api-url: group size used for the registered batch size (Atropos' flag).")
]


def sft_gen_command(
    inputs: Inputs = None,
    out: Out = None,
    format: Annotated[
        str, typer.Option("--format", help="messages | prompt-completion (TRL conversational) | atropos (legacy).")
    ] = "messages",
    save_top_n_per_group: Annotated[int, typer.Option(min=1, help="Best rollouts kept per group.")] = 3,
    minimum_score_diff_max_min: Annotated[
        float, typer.Option(help="Keep a rollout only if its score exceeds the group minimum by more than this.")
    ] = 0.0,
    allow_negative_scores: AllowNegative = False,
    min_score: MinScore = None,
    max_token_len: MaxTokenLen = None,
    max_chars: MaxChars = None,
    dedupe: Dedupe = True,
    num_seqs_to_save: NumSeqs = None,
    append_to_previous: Append = False,
    overwrite: Overwrite = False,
    tokenizer: Tokenizer = None,
    save_messages: SaveMessages = False,
    dry_run: DryRun = False,
    strict: Strict = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    reset: Reset = False,
    idle_timeout: IdleTimeout = 30.0,
    group_size: GroupSize = 2,
    tasks_per_step: Annotated[int, typer.Option(help="With --api-url: groups per batch (Atropos' flag).")] = 64,
) -> None:
    """Build an SFT dataset: the best rollouts of each group (rejection sampling), TRL-ready."""
    from atropos_cli.datagen.select import SftOptions

    with cli_errors():
        options = SftOptions(
            save_top_n_per_group=save_top_n_per_group,
            allow_negative_scores=allow_negative_scores,
            minimum_score_diff_max_min=minimum_score_diff_max_min,
            min_score=min_score,
            max_token_len=max_token_len,
            max_chars=max_chars,
            dedupe=dedupe,
            num_seqs_to_save=num_seqs_to_save,
        )
        api = _api_options(api_url, api_key, reset, idle_timeout, group_size * tasks_per_step, max_token_len)
        mode = _mode(append_to_previous, overwrite)
        _run(_Job("sft", inputs or [], out, format, options, api, tokenizer, save_messages, dry_run, strict, mode))


def dpo_gen_command(
    inputs: Inputs = None,
    out: Out = None,
    format: Annotated[
        str, typer.Option("--format", help="preference (TRL conversational prompt/chosen/rejected) | atropos.")
    ] = "preference",
    save_n_pairs_per_group: Annotated[int, typer.Option(min=1, help="Pairs made per group at most.")] = 3,
    minimum_score_diff_max_min: Annotated[
        float, typer.Option(help="A rejected answer must score more than this below the chosen one.")
    ] = 0.5,
    seed: Annotated[int, typer.Option(help="Seed of the (per-group) choice of rejected answers.")] = 0,
    allow_negative_scores: AllowNegative = False,
    min_score: MinScore = None,
    max_token_len: MaxTokenLen = None,
    max_chars: MaxChars = None,
    dedupe: Dedupe = True,
    num_seqs_to_save: NumSeqs = None,
    append_to_previous: Append = False,
    overwrite: Overwrite = False,
    tokenizer: Tokenizer = None,
    save_messages: SaveMessages = False,
    dry_run: DryRun = False,
    strict: Strict = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    reset: Reset = False,
    idle_timeout: IdleTimeout = 30.0,
    group_size: GroupSize = 2,
) -> None:
    """Build a DPO dataset: chosen/rejected pairs from each group's score spread, TRL-ready."""
    from atropos_cli.datagen.select import DpoOptions

    with cli_errors():
        options = DpoOptions(
            save_n_pairs_per_group=save_n_pairs_per_group,
            minimum_score_diff_max_min=minimum_score_diff_max_min,
            seed=seed,
            allow_negative_scores=allow_negative_scores,
            min_score=min_score,
            max_token_len=max_token_len,
            max_chars=max_chars,
            dedupe=dedupe,
            num_seqs_to_save=num_seqs_to_save,
        )
        api = _api_options(api_url, api_key, reset, idle_timeout, group_size * 8, max_token_len)
        mode = _mode(append_to_previous, overwrite)
        _run(_Job("dpo", inputs or [], out, format, options, api, tokenizer, save_messages, dry_run, strict, mode))


def _mode(append: bool, overwrite: bool) -> Literal["new", "append", "overwrite"]:
    if append and overwrite:
        raise fail("--append-to-previous and --overwrite cannot be used together", "pick one", code=2)
    return "append" if append else "overwrite" if overwrite else "new"


def _api_options(
    url: str | None, key: str | None, reset: bool, idle: float, batch_size: int, max_len: int | None
) -> Any:
    if url is None:
        if reset:
            raise fail("--reset only applies to --api-url", "drop --reset, or pass --api-url URL", code=2)
        return None
    from atropos_cli.api.client import ApiSourceOptions

    return ApiSourceOptions(
        url=url, api_key=key, reset=reset, idle_timeout=idle, batch_size=batch_size, max_token_len=max_len or 2048
    )


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
    fmt: str
    options: Any  # SftOptions | DpoOptions
    api: Any  # ApiSourceOptions | None
    tokenizer: str | None
    save_messages: bool
    dry_run: bool
    strict: bool
    mode: Literal["new", "append", "overwrite"]

    @property
    def sources(self) -> list[str]:
        return self.inputs + ([self.api.url] if self.api is not None else [])


def _run(job: _Job) -> None:
    from atropos_cli.datagen.select import DatagenStats, select_dpo, select_sft
    from atropos_cli.formats.dataset import existing_keys, row_formatter

    if not job.inputs and job.api is None:
        raise fail("no input given", "pass run dirs / rollout files, or --api-url URL", code=2)
    if job.out is None and not job.dry_run:
        raise fail("--out is required", "pass --out DIR (or --dry-run to only print the summary)", code=2)
    formatter = row_formatter(job.kind, job.fmt, job.save_messages)  # checks --format before any work
    tokenizer = _load_tokenizer(job.tokenizer)
    stats = DatagenStats()
    seen = None
    if job.mode == "append" and job.options.dedupe and job.out is not None:
        seen = existing_keys(job.out, job.kind, job.fmt, job.save_messages)
    select = select_sft if job.kind == "sft" else select_dpo
    groups = _groups(job.inputs, job.api, job.strict, _BadLines(stats))
    rows = select(groups, job.options, stats, tokenizer=tokenizer, seen=seen)
    total = None
    if job.dry_run:
        _consume(rows, stats)
    else:
        total = _write(job, (formatter(row) for row in rows), stats)
    _summary(job.kind, stats, job.out, total, job.dry_run)


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
    schema = schema_for(job.kind, job.fmt, job.save_messages)
    with DatasetWriter(job.out, schema, job.mode) as writer, _Progress(stats) as tick:
        for record in records:
            writer.write(record)
            tick()
    settings = {"format": job.fmt, "save_messages": job.save_messages, **job.options.model_dump()}
    card = render_card(
        kind=job.kind,
        fmt=job.fmt,
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
