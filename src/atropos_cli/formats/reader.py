"""Reading scored groups back: paths/globs/run dirs -> files -> a stream of `SourcedGroup`s.

Flow: `atropos view`, `sft-gen`, `dpo-gen` and the trainer's offline mode call `expand_inputs(args)` then
`iter_groups(paths, on_bad=...)`. Both formats stream (a jsonl line or a parquet batch at a time), so memory
does not grow with the file.

What is tolerated and what is not:
- a jsonl line that is not JSON, not an object or not a valid group, and a torn last line (a crash mid-write),
  are reported to `on_bad` as a `BadRecord("file:line", reason)` and skipped (`strict=True` raises instead);
- a parquet group whose rows do not form a valid group is reported as "file:row N" the same way;
- a file that is not rollouts at all (no line is a group, or a parquet file without the rollout columns)
  raises `RecordError` with a hint, whatever `strict` says.

A line holding a saved trajectory-API batch (`{"batch": [group, ...]}`, e.g. `curl .../batch > batch.json`)
reads as its groups. Atropos' own process-mode jsonl reads as is: its lines have no `meta`, and its
`messages` may hold one plain message (or string) per rollout instead of one chat per rollout;
`normalize_record` turns those into chats.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import ValidationError

from atropos_cli.errors import RecordError
from atropos_cli.types import ScoredGroup, describe_validation_error

__all__ = [
    "SourcedGroup",
    "BadRecord",
    "expand_inputs",
    "iter_groups",
    "normalize_record",
    "parse_line",
    "RUN_FILES",
]

# What a run directory holds, in the order we prefer to read it.
RUN_FILES = ("groups.jsonl", "groups.parquet")
# Bad lines seen before the first good group are held back, up to this many: a file with that many bad lines
# and no group is "not rollouts", not a run with a few bad lines.
MAX_LEADING_BAD = 1000
_GLOB_CHARS = set("*?[")
_NOT_ROLLOUTS_HINT = (
    "pass a run directory or the groups.jsonl / groups.parquet written by `atropos process` (Atropos' "
    "process-mode jsonl works too); failures.jsonl and SFT/DPO datasets are not rollouts"
)


@dataclass(frozen=True, slots=True)
class SourcedGroup:
    """A group and where it came from: `source` is the file path (or the API's URL), `index` its position among
    the file's groups (or the API's arrival order)."""

    source: str
    index: int
    group: ScoredGroup


class BadRecord(NamedTuple):
    """A skipped record: `location` is "file:line" (jsonl) or "file:row N" (parquet); `reason` says why."""

    location: str
    reason: str


def _run_file(directory: Path) -> Path:
    for name in RUN_FILES:
        if (directory / name).is_file():
            return directory / name
    raise RecordError(
        f"no groups.jsonl or groups.parquet in {str(directory)!r}",
        hint="pass a run directory written by `atropos process`, or a .jsonl / .parquet file of groups",
    )


def _expand_one(raw: str) -> list[Path]:
    path = Path(raw).expanduser()
    if path.is_dir():
        return [_run_file(path)]
    if path.is_file():
        return [path]
    if not _GLOB_CHARS & set(raw):
        raise RecordError(
            f"no such file or directory: {raw!r}",
            hint="pass a run directory, a groups .jsonl/.parquet file, or a quoted glob such as 'runs/*'",
        )
    found: list[Path] = []
    for match in sorted(glob.glob(str(path), recursive=True)):
        candidate = Path(match)
        if candidate.is_file():
            found.append(candidate)
        elif any((candidate / name).is_file() for name in RUN_FILES):
            found.append(_run_file(candidate))
    if not found:
        raise RecordError(
            f"{raw!r} matched no groups file or run directory",
            hint="check the pattern; a run directory holds groups.jsonl or groups.parquet",
        )
    return found


def expand_inputs(inputs: list[str]) -> list[Path]:
    """Files to read, in order, without repeats: a run dir gives its groups.jsonl (else groups.parquet)."""
    if not inputs:
        raise RecordError("no input given", hint="pass a run directory, a .jsonl/.parquet file or a glob")
    seen: dict[Path, None] = {}
    for raw in inputs:
        for path in _expand_one(raw):
            seen.setdefault(path, None)
    return list(seen)


def _as_chat(entry: Any, n: int) -> Any:
    if isinstance(entry, str):
        return [{"role": "user", "content": entry}]
    if isinstance(entry, dict):
        return [entry]
    if isinstance(entry, list):
        return [{"role": "user", "content": m} if isinstance(m, str) else m for m in entry]
    return entry


def normalize_record(data: dict[str, Any]) -> dict[str, Any]:
    """Atropos' legacy shapes -> ours: `messages` as one message or string per rollout becomes one chat each."""
    messages = data.get("messages")
    if not isinstance(messages, list) or all(isinstance(chat, list) for chat in messages):
        return data
    n = len(data.get("scores") or [])
    if n == 1 and len(messages) > 1 and all(isinstance(m, dict) for m in messages):
        return {**data, "messages": [messages]}  # one rollout whose chat was written without nesting
    return {**data, "messages": [_as_chat(entry, n) for entry in messages]}


def _group(data: Any) -> ScoredGroup | str:
    if not isinstance(data, dict):
        return f"not a group: expected a JSON object, got {type(data).__name__}"
    try:
        return ScoredGroup.model_validate(normalize_record(data))
    except ValidationError as exc:
        return f"not a valid group: {describe_validation_error(exc)}"


def parse_line(line: bytes) -> ScoredGroup | str:
    """A group, or the reason the line is not one."""
    try:
        data = json.loads(line)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        return f"not valid JSON ({exc})"
    return _group(data)


def _line_results(line: bytes) -> list[ScoredGroup | str]:
    """The groups of one line: one group, or each group of a saved trajectory-API batch (`GET /batch`'s
    `{"batch": [group, ...]}`, Atropos' wire shape)."""
    try:
        data = json.loads(line)
    except ValueError as exc:
        return [f"not valid JSON ({exc})"]
    if isinstance(data, dict) and isinstance(data.get("batch"), list) and "scores" not in data:
        return [_group(group) for group in data["batch"]]
    return [_group(data)]


def _open(path: Path) -> io.BufferedIOBase:
    return gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")


def _jsonl_results(path: Path) -> Iterator[tuple[int, ScoredGroup | str]]:
    """(line number, group or reason) per non-blank line; a torn last line says so."""
    with _open(path) as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            for result in _line_results(line):
                if isinstance(result, str) and not line.endswith(b"\n"):
                    result = f"incomplete last line (the writer stopped mid-line?): {result}"
                yield number, result


def _parquet_results(path: Path) -> Iterator[tuple[str, ScoredGroup | str]]:
    from atropos_cli.formats.parquet import iter_parquet_results

    for row, result in iter_parquet_results(path):
        yield f"{path}:row {row}", result


def _results(path: Path) -> Iterator[tuple[str, ScoredGroup | str]]:
    if path.suffix == ".parquet":
        yield from _parquet_results(path)
        return
    for number, result in _jsonl_results(path):
        yield f"{path}:{number}", result


def _not_rollouts(path: Path, first: BadRecord) -> RecordError:
    return RecordError(
        f"{str(path)!r} holds no scored groups (first problem, {first.location}: {first.reason})",
        hint=_NOT_ROLLOUTS_HINT,
    )


def _iter_file(path: Path, strict: bool, on_bad: Callable[[BadRecord], None] | None) -> Iterator[SourcedGroup]:
    # Bad lines before the first group are held until a group shows the file is rollouts after all.
    held: list[BadRecord] | None = []
    index = 0
    for location, result in _results(path):
        if isinstance(result, str):
            bad = BadRecord(location, result)
            if strict:
                raise RecordError(f"{location}: {result}", hint="fix or delete that line, or read without --strict")
            if held is None:
                if on_bad is not None:
                    on_bad(bad)
            elif len(held) < MAX_LEADING_BAD:
                held.append(bad)
            else:
                raise _not_rollouts(path, held[0])
            continue
        if held:
            for bad in held:
                if on_bad is not None:
                    on_bad(bad)
        held = None
        yield SourcedGroup(str(path), index, result)
        index += 1
    if held:
        raise _not_rollouts(path, held[0])


def iter_groups(
    paths: Iterable[Path],
    *,
    strict: bool = False,
    on_bad: Callable[[BadRecord], None] | None = None,
) -> Iterator[SourcedGroup]:
    """Stream the groups of each file in turn (jsonl, jsonl.gz or parquet, chosen by suffix)."""
    for path in paths:
        yield from _iter_file(Path(path), strict, on_bad)
