"""`atropos evaluate`: k samples per eval item -> metrics.json (pass@k, stderr), samples.jsonl, report.html;
`atropos evaluate --compare A B`: per-metric deltas between two eval dirs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from atropos_cli.cli.common import DottedCommand, cli_errors, console, err_console, fail

ENV_HELP = "Env: a bundled name (see `atropos envs`), an installed entry point, or a path file.py[:Class]."
DOTTED_HELP = (
    "Atropos-style dotted flags are accepted too: --env.<field> VALUE and --openai.<field> VALUE "
    "(e.g. --env.data_path test.jsonl --openai.base_url http://127.0.0.1:9001/v1)."
)


def evaluate_command(
    ctx: typer.Context,
    env: Annotated[str, typer.Argument(help=ENV_HELP)] = "arithmetic",
    num_samples: Annotated[int, typer.Option(min=1, help="Samples per item (k): pass@1..k are reported.")] = 1,
    out: Annotated[Path | None, typer.Option("--out", help="Eval directory (default: runs/eval-<env>).")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="Evaluate only the first N eval items.")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Items in flight at once.")] = 16,
    pass_threshold: Annotated[
        float, typer.Option(help="Score counted as correct when the env gives no 'correct' reward part.")
    ] = 1.0,
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible server URL (= --openai.base_url).")] = None,
    model: Annotated[str | None, typer.Option(help="Model name, or a local model dir (= --openai.model_name).")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="OPENAI_API_KEY", help="API key (= --openai.api_key).")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of the env's items (= --env.seed).")] = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="YAML config (Atropos layout: env:, openai:).")
    ] = None,
    resume: Annotated[bool, typer.Option(help="Finish an interrupted eval in --out (skips finished items).")] = False,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing eval in --out.")] = False,
    compare: Annotated[
        tuple[Path, Path] | None,
        typer.Option("--compare", help="Compare two eval dirs A B: per-metric deltas (B - A); runs nothing."),
    ] = None,
) -> None:
    """Evaluate ENV on its eval split: pass@1..k (unbiased estimator), mean score, stderr, and a report.

    With no server flags, ENV runs on the local backend with the shipped model atropos-tiny-arith.
    """
    if compare:
        with cli_errors():
            _compare(*compare, out)
        return
    from atropos_cli.cli.process import plain_overrides, warn_bad_lines
    from atropos_cli.env.loading import load_env, uses_default_local_model
    from atropos_cli.runs.evaluate import EvalPaths, prepare_eval_dir

    with cli_errors():
        overrides = plain_overrides(seed=seed, base_url=base_url, model=model, api_key=api_key)
        # k samples per item are one group; an eval must never drop a group for having identical scores.
        overrides["env"].update(group_size=num_samples, ensure_scores_are_not_same=False)
        loaded = load_env(env, list(ctx.args), str(config) if config else None, overrides, mode="evaluate")
        paths = EvalPaths(out or _default_out(env))
        skip, bad_lines = prepare_eval_dir(paths, loaded.run_config, num_samples, resume=resume, overwrite=overwrite)
        warn_bad_lines(bad_lines, "an item with a sample on such a line is evaluated again")
        if uses_default_local_model(loaded.servers):
            err_console.print("no --openai.base_url given: using the local backend with atropos-tiny-arith")
        stats = _run_with_progress(loaded, paths, num_samples, concurrency, limit, skip, pass_threshold)
        _report(paths)
    _print_metrics(stats.document)
    if stats.own_evaluate and not stats.items_total:  # the env evaluated itself: there were no items of ours
        console.print(f"ran {loaded.env.name}'s own evaluate() in {stats.elapsed_s:.1f}s; wrote {paths.root}")
        return
    console.print(
        f"evaluated {stats.items_total} items x {num_samples} samples in {stats.elapsed_s:.1f}s "
        f"({stats.counts.failed_rollouts} samples failed, {stats.items_resumed} items kept from before); "
        f"wrote {paths.root}"
    )
    if stats.items_total and stats.counts.failed_rollouts == stats.items_total * num_samples:
        raise fail(f"every sample failed; see {paths.failures}", hint="check the server and the env")


def _default_out(env: str) -> Path:
    from atropos_cli.env.registry import spec_stem
    from atropos_cli.runs.process import default_out_dir

    return default_out_dir(f"eval-{spec_stem(env)}")


def _run_with_progress(
    loaded: Any, paths: Any, k: int, concurrency: int, limit: int | None, skip: set[int], threshold: float
) -> Any:
    from atropos_cli.runs.evaluate import run_eval

    columns = [TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} items")]
    with Progress(*columns, TimeRemainingColumn(), console=err_console, transient=False) as progress:
        task = progress.add_task(f"eval {loaded.env.name}", total=None)

        def on_progress(stats: Any) -> None:
            progress.update(task, completed=stats.items_done, total=stats.items_total)

        return asyncio.run(
            run_eval(
                loaded, paths, num_samples=k, concurrency=concurrency, limit=limit, skip=skip,
                pass_threshold=threshold, on_progress=on_progress,
            )
        )  # fmt: skip


def _report(paths: Any, compare: Any = None) -> None:
    from atropos_cli.runs.evaluate import load_metrics, read_samples
    from atropos_cli.runs.report import render_eval_report

    render_eval_report(paths.report, load_metrics(paths.root), read_samples(paths.samples), compare)


def _print_metrics(document: dict[str, Any]) -> None:
    general, metrics = document["config_general"], document["results"]["all"]
    table = Table(title=f"{general['env']} · {general['model_name']}", header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("± stderr", justify="right")
    for name, value in metrics.items():
        if name.endswith("_stderr"):
            continue
        err = metrics.get(f"{name}_stderr")
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        table.add_row(name, shown, f"{err:.4f}" if isinstance(err, float) else "")
    console.print(table)


def _compare(a: Path, b: Path, out: Path | None) -> None:
    from atropos_cli.runs.evaluate import EvalPaths, load_metrics, read_samples
    from atropos_cli.runs.metrics import compare_metrics

    doc_a, doc_b = load_metrics(a), load_metrics(b)
    deltas = compare_metrics(doc_a["results"]["all"], doc_b["results"]["all"])
    table = Table(title=f"{a} → {b}", header_style="bold")
    for column in ("metric", "A", "B", "Δ (B − A)", "± stderr"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    for d in deltas:
        style = "green" if d.delta and d.delta > 0 else "red" if d.delta and d.delta < 0 else ""
        delta = Text("–" if d.delta is None else f"{d.delta:+.4f}", style=style)
        count = d.metric.startswith(("num_", "failed_"))
        table.add_row(d.metric, _fmt(d.a, count), _fmt(d.b, count), delta, _fmt(d.stderr))
    console.print(table)
    if out is not None:
        from atropos_cli.runs.report import render_eval_report

        path = render_eval_report(Path(out) / "compare.html", doc_b, read_samples(EvalPaths(b).samples),
                                  (str(a), str(b), deltas))  # fmt: skip
        console.print(f"wrote {path}")


def _fmt(value: float | None, count: bool = False) -> str:
    if value is None:
        return "–"
    return f"{value:.0f}" if count else f"{value:.4f}"


def register(app: typer.Typer) -> None:
    app.command(
        "evaluate",
        cls=DottedCommand,
        epilog=DOTTED_HELP,
    )(evaluate_command)
