"""The output-directory contract shared by `process`, `evaluate` and friends: refuse, overwrite, or resume.

An existing output is refused unless `--overwrite` (which removes it) or `--resume` (which requires the saved
config and refuses one that differs, naming the changed keys). A new run writes its resolved config first.

A run that wrote no record (its jsonl files are empty: it failed before its first group, e.g. no server
answered) blocks nothing: a new run with the same `--out` (or the default one) reuses what it left.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from atropos_cli.config import RunConfig, config_diff, read_saved
from atropos_cli.errors import ConfigError, OutputExistsError

__all__ = ["claim_output", "holds_no_records"]


def claim_output(
    root: Path, config_path: Path, outputs: Sequence[Path], run_config: RunConfig, *, resume: bool, overwrite: bool
) -> None:
    """Make `root` ours for this run; on return with `resume`, the saved config matches `run_config`."""
    if resume:
        if not config_path.exists():
            raise ConfigError(
                f"nothing to resume in {str(root)!r}: no {config_path.name}", hint="start a new run without --resume"
            )
        saved = read_saved(config_path, "restore the run's config.yaml, or start a new run without --resume") or {}
        changed = config_diff(saved, run_config.model_dump(mode="json"))
        if changed:
            raise ConfigError(
                f"--resume with a different config: {', '.join(changed)} changed",
                hint=f"use the original settings (saved in {config_path}), or start a new run with another --out",
            )
        return
    existing = [p for p in outputs if p.exists()]
    if existing and not overwrite and not holds_no_records(existing):
        raise OutputExistsError(
            f"output {str(existing[0])!r} already exists",
            hint="pass --resume to continue that run, --overwrite to replace it, or --out for a new one",
        )
    for path in existing:
        path.unlink()
    root.mkdir(parents=True, exist_ok=True)
    config_path.write_text(run_config.to_yaml())


def holds_no_records(paths: Sequence[Path]) -> bool:
    """True when none of `paths` holds a record: every .jsonl (the durable record) is empty and nothing is a
    directory; the config and what is derived from the jsonl (parquet, HTML, metrics) do not count."""
    return all(p.is_file() and (p.suffix != ".jsonl" or p.stat().st_size == 0) for p in paths)
