"""`atropos process` as a library: run an env offline into a run directory that loses nothing.

Layout of a run (`--out DIR`)::

    DIR/config.yaml       the resolved config (what --resume compares against)
    DIR/groups.jsonl      one ScoredGroup per line, flushed per group (the durable record)
    DIR/failures.jsonl    one RolloutFailure per line: failed rollouts, failed groups, filtered groups
    DIR/groups.parquet    one row per rollout, rewritten from groups.jsonl at the end of the run
    DIR/index.html        the viewer, rendered at the end of the run

With Atropos' `--env.data_path_to_save_groups out.jsonl` the same files sit beside it: out.jsonl,
out.failures.jsonl, out.parquet, out.html, out.config.yaml.

`--resume` re-reads groups.jsonl, skips item indices already written (the item stream is seeded and
deterministic) and refuses a config that differs, naming the keys. Ctrl-C stops new groups, lets in-flight
ones finish, and still writes parquet + HTML.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from atropos_cli.config import RunConfig
from atropos_cli.env.loading import LoadedEnv
from atropos_cli.formats.reader import BadRecord, parse_line
from atropos_cli.runs.counts import RolloutCounts
from atropos_cli.runs.envcall import call_env
from atropos_cli.runs.rollout import GroupOutcome, run_groups
from atropos_cli.runs.rundir import claim_output, holds_no_records

__all__ = [
    "RunPaths",
    "ProcessStats",
    "ResumeState",
    "prepare_output",
    "scan_for_resume",
    "run_process",
    "default_out_dir",
    "ProcessReport",
    "process_report",
]


@dataclass(frozen=True)
class RunPaths:
    root: Path
    groups: Path
    failures: Path
    parquet: Path
    html: Path
    config: Path

    @classmethod
    def for_dir(cls, root: Path) -> RunPaths:
        return cls(
            root,
            root / "groups.jsonl",
            root / "failures.jsonl",
            root / "groups.parquet",
            root / "index.html",
            root / "config.yaml",
        )

    @classmethod
    def for_jsonl(cls, path: Path) -> RunPaths:
        stem = path.with_suffix("")
        return cls(
            path.parent,
            path,
            Path(f"{stem}.failures.jsonl"),
            stem.with_suffix(".parquet"),
            stem.with_suffix(".html"),
            Path(f"{stem}.config.yaml"),
        )

    def outputs(self) -> list[Path]:
        return [self.groups, self.failures, self.parquet, self.html, self.config]


@dataclass
class ProcessStats:
    counts: RolloutCounts = field(default_factory=RolloutCounts)
    resumed_groups: int = 0
    started: float = field(default_factory=time.perf_counter)
    interrupted: bool = False

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started


def default_out_dir(env_name: str, base: Path = Path("runs")) -> Path:
    """runs/<env>, or runs/<env>-2, -3, ... when one holds records (only for the default; an explicit --out is
    refused); a directory left by a run that wrote nothing is reused."""
    from atropos_cli.env.registry import spec_stem

    stem = spec_stem(env_name)
    candidate = base / stem
    n = 2
    while candidate.exists() and not holds_no_records(list(candidate.iterdir())):
        candidate = base / f"{stem}-{n}"
        n += 1
    return candidate


@dataclass
class ResumeState:
    """What `--resume` found: the item indices to skip, and the lines it could not read (left in place)."""

    skip: set[int] = field(default_factory=set)
    bad_lines: list[BadRecord] = field(default_factory=list)


def _scan_lines(path: Path, state: ResumeState, index_of: Callable[[bytes], int | None | str]) -> None:
    """Add each line's item index to `state.skip`; a line `index_of` cannot read (a str reason) is reported."""
    if not path.exists():
        return
    _truncate_partial_line(path)
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            found = index_of(line)
            if isinstance(found, str):
                state.bad_lines.append(BadRecord(f"{path}:{number}", found))
            elif found is not None:
                state.skip.add(found)


def _group_index(line: bytes) -> int | None | str:
    result = parse_line(line)
    if isinstance(result, str):
        return result
    return result.meta.index if result.meta is not None else None


def _filtered_index(line: bytes) -> int | None | str:
    try:
        record = json.loads(line)
    except ValueError as exc:
        return f"not valid JSON ({exc})"
    if not isinstance(record, dict):
        return f"not a failure record: expected a JSON object, got {type(record).__name__}"
    index = record.get("index")
    if record.get("error_type") != "Filtered" or index is None:
        return None
    return index if isinstance(index, int) else f"index is {index!r}, expected an integer"


def scan_for_resume(paths: RunPaths) -> ResumeState:
    """Item indices already in groups.jsonl (and filtered in failures.jsonl); drops a torn last line.

    A corrupt line elsewhere is left in place and listed in `bad_lines`: its item (unknown) is collected again.
    """
    state = ResumeState()
    _scan_lines(paths.groups, state, _group_index)
    _scan_lines(paths.failures, state, _filtered_index)
    return state


def _truncate_partial_line(path: Path) -> None:
    """A crash mid-write can leave a last line without its newline: cut it so appends stay valid jsonl."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])


def prepare_output(paths: RunPaths, run_config: RunConfig, *, resume: bool, overwrite: bool) -> ResumeState:
    """Create or check the run directory; when resuming, what is already done (and what could not be read)."""
    claim_output(paths.root, paths.config, paths.outputs(), run_config, resume=resume, overwrite=overwrite)
    return scan_for_resume(paths) if resume else ResumeState()


async def run_process(
    loaded: LoadedEnv,
    paths: RunPaths,
    *,
    num_groups: int,
    concurrency: int,
    skip: set[int],
    on_progress: Callable[[ProcessStats], None] = lambda stats: None,
) -> ProcessStats:
    """Set up the env, run the groups concurrently, stream them to jsonl; then parquet + HTML."""
    from atropos_cli.formats.jsonl import JsonlWriter

    stats = ProcessStats(resumed_groups=len(skip))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    handles_sigint = _install_sigint(loop, _interrupt_handler(loop, stop, stats))
    try:
        await call_env(loaded.env, "setup", loaded.env.setup())
        with (
            JsonlWriter(paths.groups, append=True) as groups_out,
            JsonlWriter(paths.failures, append=True) as failures_out,
        ):

            def write(outcome: GroupOutcome) -> None:
                for group in outcome.groups:
                    groups_out.write(group)
                for failure in [*outcome.failures, *outcome.filtered]:
                    failures_out.write(failure)
                stats.counts.add(outcome)
                on_progress(stats)

            try:
                await run_groups(
                    loaded.env, num_items=num_groups, concurrency=concurrency, on_outcome=write, skip=skip, stop=stop
                )
            except asyncio.CancelledError:
                stats.interrupted = True
    finally:
        if handles_sigint:
            loop.remove_signal_handler(signal.SIGINT)
        await loaded.server.aclose()
        finish_outputs(paths)
    return stats


def _interrupt_handler(loop: asyncio.AbstractEventLoop, stop: asyncio.Event, stats: ProcessStats) -> Callable[[], None]:
    """The first Ctrl-C stops new groups (in-flight ones finish); a second one cancels those too."""

    def interrupt() -> None:
        if stop.is_set():
            for task in asyncio.all_tasks(loop):
                task.cancel()
        stats.interrupted = True
        stop.set()

    return interrupt


def _install_sigint(loop: asyncio.AbstractEventLoop, handler: Callable[[], None]) -> bool:
    """Ctrl-C stops the run gracefully; only possible from the main thread (tests may run us elsewhere)."""
    try:
        loop.add_signal_handler(signal.SIGINT, handler)
    except (NotImplementedError, RuntimeError, ValueError):
        return False
    return True


def count_lines(path: Path) -> int:
    """Non-blank lines of a jsonl file, read as bytes: a line that is not UTF-8 still counts."""
    if not path.exists():
        return 0
    with path.open("rb") as handle:
        return sum(1 for line in handle if line.strip())


def finish_outputs(paths: RunPaths) -> None:
    """Rewrite groups.parquet and index.html from groups.jsonl (the durable record)."""
    from atropos_cli.formats.html import render_html, run_decoder
    from atropos_cli.formats.parquet import write_parquet
    from atropos_cli.formats.reader import iter_groups

    if not paths.groups.exists():
        return
    groups = list(iter_groups([paths.groups]))  # read (and validate) once, feed both writers
    write_parquet((s.group for s in groups), paths.parquet)
    failures = count_lines(paths.failures)
    token_only = any(s.group.messages is None and s.group.tokens for s in groups)
    decode = run_decoder(paths.config) if token_only else None
    render_html(groups, paths.html, title=f"atropos run: {paths.root}", failures=failures, decode=decode)


@dataclass(frozen=True)
class ProcessReport:
    """What a finished `process` run tells the user (`atropos process` and `python env.py process` alike):
    the summary line, an optional note, and the error when every group errored (exit non-zero)."""

    summary: str
    note: str | None
    error: str | None


def process_report(stats: ProcessStats, paths: RunPaths) -> ProcessReport:
    """Filtered groups are the env's choice (Atropos' `None`), not failures: a run whose every group was
    filtered says so and succeeds; only a run whose every group errored is an error."""
    counts = stats.counts
    kept = f"; {stats.resumed_groups} kept from before" if stats.resumed_groups else ""
    summary = f"wrote {counts.summary()} to {paths.root} in {stats.elapsed:.1f}s{kept}"
    note = None
    if counts.groups == 0 and counts.filtered_groups:
        reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(counts.filtered.items()))
        note = f"the env filtered every group it finished ({reasons}); see {paths.failures}"
    error = None
    if counts.groups == 0 and counts.failed_groups and not counts.filtered_groups:
        error = f"every group failed; see {paths.failures}"
    return ProcessReport(summary, note, error)
