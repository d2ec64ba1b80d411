"""`atropos port FILE`: what an Atropos env file uses that we lack (read, not run); `--run` adds one live group.

The live group (only with --run: the file's code then runs as you, unsandboxed) runs on the server the user
names (`--base-url`, or `--openai.base_url`), else on the shipped local model; when that model cannot serve
the env (its context is shorter than the env's prompts, or it produces no group), on the format-aware fake
server (`testing.format_rule`) instead. The output says which one answered; a failed group prints its first
error and keeps its run folder (`runs/port-<file>/`, with failures.jsonl). A run whose every server call failed
(the env then often drops its group itself) is a failure, not an env that "runs here".

`FILE:Class` names the env class of a file that defines several; without it the file runs the class its
`__main__` block runs (`X.cli()`), and the static check says which.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from atropos_cli.cli.common import cli_errors, console, fail
from atropos_cli.errors import EXIT_USAGE

if TYPE_CHECKING:
    from atropos_cli.compat.port import PortReport


def port_command(
    ctx: typer.Context,
    env: Annotated[
        str,
        typer.Argument(
            help="An env file written for atroposlib: FILE.py, or FILE.py:Class to pick one of several env classes.",
            metavar="FILE[:CLASS]",
        ),
    ],
    run: Annotated[
        bool,
        typer.Option(
            "--run",
            help="Also import the file and run one live group: the file's code runs as you, unsandboxed (only for "
            "files you trust).",
        ),
    ] = False,
    base_url: Annotated[
        str | None, typer.Option(help="With --run: run the group against this OpenAI-compatible server.")
    ] = None,
) -> None:
    """Check an Atropos env file without running it: what it uses that we lack (read from its source).

    Lists each atroposlib name the file imports that we do not provide (file:line), what needs the hub, the data
    files it reads by a relative path (and whether each is there) and the env class it runs. With --run it then
    imports the file (its code runs unsandboxed) and runs one group: on --base-url when given, else on the
    shipped local model, else (when that model cannot serve the env) on a fake server that answers in the env's
    format. Extra dotted flags (--env.*, --openai.*) pass through to that run.
    """
    from atropos_cli.compat.port import scan_env_file

    path, _, class_name = env.partition(":")
    file = Path(path)
    if not file.is_file():
        raise fail(
            f"env file {path!r} does not exist", hint="check the path (FILE.py or FILE.py:Class)", code=EXIT_USAGE
        )
    with cli_errors():
        report = scan_env_file(file)
    console.print(f"{file}: imports {len(set(report.imported))} atroposlib modules", soft_wrap=True, markup=False)
    for finding in report.missing:
        console.print(f"  {file}:{finding.line}: missing: {finding.message}", style="red", soft_wrap=True, markup=False)
    for finding in report.notes:
        console.print(f"  {file}:{finding.line}: note: {finding.message}", style="yellow", soft_wrap=True, markup=False)
    _print_data_files(file, report)
    _print_env_class(report, class_name)
    if report.missing:
        raise fail(f"{len(report.missing)} atroposlib names are not provided", hint="see docs/envs-atropos.md")
    console.print("  every atroposlib name it imports is provided")
    if run:
        _live_check(env, file, list(ctx.args), base_url)
    else:
        console.print(
            "  the file was read, not run: --run imports it and runs one group (its code runs as you, unsandboxed)",
            soft_wrap=True, markup=False,
        )  # fmt: skip


def _print_data_files(file: Path, report: PortReport) -> None:
    """Each data file the env reads by a relative path, and whether it is there."""
    for data in report.data_files:
        if data.exists:
            state = "present"
        elif data.run_from:
            state = f"not beside the file; present from {data.run_from} (run the env from there)"
        else:
            state = "MISSING"
        line = f"  {file}:{data.line}: data: {data.path} ({data.anchor}): {state}"
        console.print(line, style=None if data.exists else "yellow", soft_wrap=True, markup=False)
    missing = sum(not d.exists and not d.run_from for d in report.data_files)
    if missing:
        console.print(
            f"  data files missing: {missing} of {len(report.data_files)}; the env fails where it opens them unless "
            "it falls back (put them where it looks)",
            style="yellow", soft_wrap=True, markup=False,
        )  # fmt: skip


def _print_env_class(report: PortReport, class_name: str) -> None:
    """Which env class runs: the one named after `:`, else the one the `__main__` block runs."""
    if class_name and class_name not in report.classes:
        defined = ", ".join(report.classes) or "none"
        raise fail(f"{report.path} defines no class {class_name!r}", hint=f"its classes: {defined}", code=EXIT_USAGE)
    if class_name:
        console.print(f"  env class: {class_name} (named after ':')", soft_wrap=True, markup=False)
    elif report.main_class:
        console.print(
            f"  env class: {report.main_class}, the one its __main__ block runs ({report.main_class}.cli()); "
            "FILE:Class runs another",
            soft_wrap=True, markup=False,
        )  # fmt: skip


def _live_check(spec: str, file: Path, extra: list[str], base_url: str | None) -> None:
    named = base_url or _flag(extra, "--openai.base_url")
    if named:
        openai = {"base_url": named}
        _one_group(spec, file, extra, {"openai": openai}, f"the server at {named}", final=True)
        return
    local = {"server_type": "local", "model_name": "atropos-tiny-arith", "base_url": ""}
    if _one_group(spec, file, extra, {"openai": local}, "the shipped local model (atropos-tiny-arith)", final=False):
        return
    from atropos_cli.resources import resolve_model_path
    from atropos_cli.testing.fake_server import FakeInferenceServer
    from atropos_cli.testing.format_rule import FormatAwareRule

    console.print("  the shipped model cannot serve this env; trying the format-aware fake server")
    with FakeInferenceServer(FormatAwareRule(), tokenizer=str(resolve_model_path("atropos-tiny-arith"))) as fake:
        openai = {"base_url": fake.base_url, "server_type": "vllm", "model_name": "fake-model", "api_key": "x"}
        _one_group(spec, file, extra, {"openai": openai}, f"the format-aware fake server ({fake.base_url})", final=True)


def _flag(args: list[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _one_group(
    spec: str, file: Path, extra: list[str], server: dict[str, dict[str, Any]], what: str, final: bool
) -> bool:
    """One group of the env `spec` (`file`, or `file:Class`) on `server`; True when it produced a group, or
    filtered one it made from answers. A failure prints the first error and keeps the run folder; unless `final`,
    it only says so (the caller tries another server)."""
    from atropos_cli.env.loading import load_env
    from atropos_cli.runs.process import RunPaths, default_out_dir, prepare_output, run_process

    overrides: dict[str, dict[str, Any]] = {
        "env": {"total_steps": 1, "tokenizer_name": "atropos-tiny-arith", "use_wandb": False},
        **server,
    }
    with cli_errors():
        loaded = load_env(spec, extra, None, overrides, mode="process")
        paths = RunPaths.for_dir(default_out_dir(f"port-{file.stem}"))
        prepare_output(paths, loaded.run_config, resume=False, overwrite=False)
        stats = asyncio.run(run_process(loaded, paths, num_groups=1, concurrency=1, skip=set()))
    counts = stats.counts
    if counts.groups:
        console.print(f"  one group ran on {what}: the env works here ({paths.root})", soft_wrap=True, markup=False)
        return True
    errors, first_server_error = _failed_calls(loaded.server)
    if errors:
        said = f"no group: every server call failed ({errors} errors)"
        first = f"first error: {first_server_error} (all: {paths.failures})"
        console.print(f"  on {what}: {said}; {first}", soft_wrap=True, markup=False)
        if final:
            raise fail(f"the env produced {said} on {what}", hint="see the first error above; check the server")
        return False
    if counts.filtered_groups:
        reasons = ", ".join(counts.filtered)
        console.print(f"  on {what} the env filtered its group ({reasons}): it runs here", soft_wrap=True, markup=False)
        return True
    first = _first_error(paths.failures)
    console.print(f"  on {what}: no group; first error: {first} (all: {paths.failures})", soft_wrap=True, markup=False)
    if final:
        raise fail(f"the env produced no group on {what}", hint=f"all failures: {paths.failures}")
    return False


def _failed_calls(server: Any) -> tuple[int, str | None]:
    """(failed calls, the first one's error) when the env's server calls all failed; (0, None) otherwise (some
    answered, none was made, or the server keeps no count)."""
    stats = server.stats() if callable(getattr(server, "stats", None)) else {}
    requests, failures = stats.get("requests", 0), stats.get("failures", 0)
    if not failures or failures != requests:
        return 0, None
    first = next((s.get("first_error") for s in stats.get("servers", []) if s.get("first_error")), None)
    return failures, first


def _first_error(failures: Path) -> str:
    import json

    if not failures.is_file():
        return "(none recorded)"
    for line in failures.read_text().splitlines():
        record = json.loads(line)
        return str(record.get("error"))
    return "(none recorded)"


def register(app: typer.Typer) -> None:
    app.command("port", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(port_command)
