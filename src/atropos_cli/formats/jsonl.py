"""The jsonl sink: one record per line, flushed per line, so a crash loses at most the line being written.

Flow: `atropos process` opens one `JsonlWriter` for `groups.jsonl` and one for `failures.jsonl` and writes
each `ScoredGroup` (as `to_record()`: Atropos' keys plus `meta`, empty optional keys left out) or
`RolloutFailure` as soon as it exists. `readers.iter_groups` reads the file back and reports a torn last line
instead of failing on it.

Lines are compact JSON with non-ASCII text kept readable (UTF-8). Appending to a file whose last line was
torn by a crash first ends that line, so the torn line stays one bad line instead of swallowing the next
record.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import pydantic_core
from pydantic import BaseModel

from atropos_cli.types import ScoredGroup

__all__ = ["JsonlWriter", "record_dict", "dumps_compact", "dumps_line"]


def record_dict(record: BaseModel) -> dict[str, Any]:
    """The dict one record becomes on disk: `to_record()` for a group, else its JSON dump without nulls."""
    if isinstance(record, ScoredGroup):
        return record.to_record()
    return record.model_dump(mode="json", exclude_none=True)


# Characters JSON leaves raw but str.splitlines() treats as line breaks: escaped, so one record stays one line
# for every reader.
_LINE_BREAKS = {"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def dumps_compact(data: Any) -> str:
    """Compact JSON, always valid UTF-8, one line for every reader.

    pydantic-core's encoder does the work (several times faster than `json.dumps`; floats round-trip
    exactly); a lone surrogate in model output, which it refuses, falls back to ASCII escapes.
    """
    try:
        text = pydantic_core.to_json(data).decode("utf-8")
    except pydantic_core.PydanticSerializationError:
        return json.dumps(data, ensure_ascii=True, separators=(",", ":"))
    for raw, escaped in _LINE_BREAKS.items():
        if raw in text:
            text = text.replace(raw, escaped)
    return text


def dumps_line(data: Any) -> str:
    """One jsonl line, newline included."""
    return dumps_compact(data) + "\n"


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as handle:
        handle.seek(-1, 2)
        return handle.read(1) == b"\n"


class JsonlWriter:
    """Write pydantic records to a jsonl file, one per line, flushing after each line.

    Use as a context manager: `with JsonlWriter(path) as out: out.write(group)`. `append=True` keeps the
    existing lines (resume); otherwise the file is truncated. Parent directories are created. `count` is the
    number of lines this writer wrote.
    """

    def __init__(self, path: Path, append: bool = False) -> None:
        self.path = Path(path)
        self.append = append
        self.count = 0
        self._handle: IO[str] | None = None

    def open(self) -> JsonlWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        torn = self.append and self.path.is_file() and self.path.stat().st_size > 0
        torn = torn and not _ends_with_newline(self.path)
        self._handle = self.path.open("a" if self.append else "w", encoding="utf-8", newline="\n")
        if torn:
            self._handle.write("\n")
            self._handle.flush()
        return self

    def write(self, record: BaseModel) -> None:
        if self._handle is None:
            self.open()
        assert self._handle is not None
        self._handle.write(dumps_line(record_dict(record)))
        self._handle.flush()
        self.count += 1

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def __enter__(self) -> JsonlWriter:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
