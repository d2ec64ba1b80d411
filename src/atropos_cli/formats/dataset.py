"""Writes SFT rows and DPO pairs as a dataset directory: train.jsonl, train.parquet and a README.md card.

The last step of sft-gen / dpo-gen (`datagen` selects, this module lays rows out and writes them):

    SftRow / DpoRow ──► format_sft / format_dpo (one dict per row, a fixed pyarrow schema per format)
                    ──► DatasetWriter (jsonl line per row, parquet row groups, both streamed) ──► OUT/

Formats: TRL's conversational `messages`, `prompt-completion` and `preference` layouts (they load with
`datasets` and train with TRL as they are), or Atropos' legacy records (`atropos`). Every row carries its
provenance columns. Files are written under `.partial` names and renamed only when the run finishes, so a
crash or Ctrl-C never leaves a half-written dataset where a good one was.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import orjson
import pyarrow as pa

from atropos_cli.datagen.samples import split_messages
from atropos_cli.datagen.select import DatagenStats, DpoRow, SftRow, row_key
from atropos_cli.errors import ConfigError, OutputExistsError
from atropos_cli.formats.jsonl import dumps_line

__all__ = [
    "SFT_FORMATS",
    "DPO_FORMATS",
    "WriteMode",
    "schema_for",
    "row_formatter",
    "DatasetWriter",
    "check_output",
    "render_card",
    "existing_keys",
]

SFT_FORMATS = ("messages", "prompt-completion", "atropos")
DPO_FORMATS = ("preference", "atropos")
WriteMode = Literal["new", "append", "overwrite"]
FILES = ("train.jsonl", "train.parquet", "README.md")

_MESSAGES = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
_PROVENANCE = [
    ("source", pa.string()),
    ("env", pa.string()),
    ("model", pa.string()),
    ("group_id", pa.string()),
    ("item_id", pa.string()),
    ("score", pa.float64()),
]
_DPO_EXTRA = [("rejected_score", pa.float64()), ("margin", pa.float64())]
_PROVENANCE_NAMES = {name for name, _ in _PROVENANCE + _DPO_EXTRA}


def schema_for(kind: Literal["sft", "dpo"], fmt: str, save_messages: bool = False) -> pa.Schema:
    """The parquet schema (and jsonl key order) of a dataset kind and format."""
    if kind == "sft":
        payload = {
            "messages": [("messages", _MESSAGES)],
            "prompt-completion": [("prompt", _MESSAGES), ("completion", _MESSAGES)],
            "atropos": [("messages", _MESSAGES)]
            if save_messages
            else [("prefix", pa.string()), ("completion", pa.string())],
        }[fmt]
        return pa.schema(payload + _PROVENANCE)
    if fmt == "preference":
        payload = [("prompt", _MESSAGES), ("chosen", _MESSAGES), ("rejected", _MESSAGES)]
    elif save_messages:
        payload = [("pos", _MESSAGES), ("neg", _MESSAGES)]
    else:
        payload = [("prefix", pa.string()), ("pos", pa.string()), ("neg", pa.string())]
    return pa.schema(payload + _PROVENANCE + _DPO_EXTRA)


def _provenance(row: SftRow | DpoRow) -> dict[str, Any]:
    p = row.provenance
    return {
        "source": p.source,
        "env": p.env,
        "model": p.model,
        "group_id": p.group_id,
        "item_id": p.item_id,
        "score": row.score,
    }


def _sft_record(row: SftRow, fmt: str, save_messages: bool) -> dict[str, Any]:
    s = row.sample
    if fmt == "messages" or (fmt == "atropos" and save_messages):
        out: dict[str, Any] = {"messages": s.prompt + s.completion}
    elif fmt == "prompt-completion":
        out = {"prompt": s.prompt, "completion": s.completion}
    else:
        prefix, completion = s.text_pair()
        out = {"prefix": prefix, "completion": completion}
    out.update(_provenance(row))
    return out


def _dpo_record(row: DpoRow, fmt: str, save_messages: bool) -> dict[str, Any]:
    if fmt == "preference":
        out: dict[str, Any] = {
            "prompt": row.prompt,
            "chosen": row.chosen.completion,
            "rejected": row.rejected.completion,
        }
    elif save_messages:
        out = {"pos": row.prompt + row.chosen.completion, "neg": row.prompt + row.rejected.completion}
    else:
        prefix, pos = row.chosen.text_pair()
        out = {"prefix": prefix, "pos": pos, "neg": row.rejected.text_pair()[1]}
    out.update(_provenance(row))
    out["rejected_score"] = row.rejected_score
    out["margin"] = row.score - row.rejected_score
    return out


def row_formatter(
    kind: Literal["sft", "dpo"], fmt: str, save_messages: bool = False
) -> Callable[[Any], dict[str, Any]]:
    """A function turning one SftRow/DpoRow into the dict written for `fmt`."""
    allowed = SFT_FORMATS if kind == "sft" else DPO_FORMATS
    if fmt not in allowed:
        raise ConfigError(f"unknown {kind} format {fmt!r}", hint=f"choose one of: {', '.join(allowed)}")
    if kind == "sft":
        return lambda row: _sft_record(row, fmt, save_messages)
    return lambda row: _dpo_record(row, fmt, save_messages)


def _keys_of(kind: str, fmt: str, save_messages: bool, row: dict[str, Any]) -> int | None:
    if kind == "sft" and "messages" in row:
        return row_key(*split_messages(row["messages"]))
    if kind == "sft" and fmt == "prompt-completion":
        return row_key(row["prompt"], row["completion"])
    if kind == "dpo" and fmt == "preference":
        return row_key(row["prompt"], row["chosen"], row["rejected"])
    if kind == "dpo" and save_messages:
        prompt, chosen = split_messages(row["pos"])
        return row_key(prompt, chosen, split_messages(row["neg"])[1])
    return None


def existing_keys(out_dir: Path, kind: Literal["sft", "dpo"], fmt: str, save_messages: bool = False) -> set[int]:
    """Dedupe keys of the rows already in OUT/train.parquet, so --append-to-previous never repeats a row.

    Atropos' legacy text records (prefix/completion strings) cannot be turned back into messages: empty set.
    """
    import pyarrow.parquet as pq

    path = out_dir / "train.parquet"
    payload = [name for name in schema_for(kind, fmt, save_messages).names if name not in _PROVENANCE_NAMES]
    if not path.exists() or (fmt == "atropos" and not save_messages):
        return set()
    keys: set[int] = set()
    for batch in pq.ParquetFile(path, pre_buffer=False).iter_batches(columns=payload):
        for row in batch.to_pylist():
            try:
                key = _keys_of(kind, fmt, save_messages, row)
            except ValueError:  # a hand-edited row without a completion: nothing to dedupe against
                continue
            if key is not None:
                keys.add(key)
    return keys


def check_output(out_dir: Path, mode: WriteMode) -> None:
    """Refuse to touch an existing dataset unless the user asked to append or overwrite."""
    if mode != "new":
        return
    existing = [name for name in FILES if (out_dir / name).exists()]
    if existing:
        raise OutputExistsError(
            f"output {str(out_dir)!r} already holds a dataset ({', '.join(existing)})",
            hint="pass --append-to-previous to add rows to it, --overwrite to replace it, or choose another --out",
        )
    if out_dir.exists() and not out_dir.is_dir():
        raise OutputExistsError(f"output {str(out_dir)!r} is a file", hint="--out names a directory")


class DatasetWriter:
    """Streams rows into OUT/train.jsonl and OUT/train.parquet; `close()` renames the finished files into place."""

    def __init__(self, out_dir: Path, schema: pa.Schema, mode: WriteMode, *, batch_rows: int = 4096) -> None:
        check_output(out_dir, mode)
        self.out_dir = out_dir
        self.schema = schema
        self.mode = mode
        self.batch_rows = batch_rows
        self.rows_before = 0
        self.rows_added = 0
        # Parquet rows are buffered column by column (cheaper for arrow than a list of row dicts).
        self._columns: dict[str, list[Any]] = {name: [] for name in schema.names}
        self._pending = 0
        self._jsonl_path = out_dir / "train.jsonl.partial"
        self._parquet_path = out_dir / "train.parquet.partial"
        self._jsonl: Any = None
        self._parquet: Any = None

    def __enter__(self) -> DatasetWriter:
        import pyarrow.parquet as pq

        self.out_dir.mkdir(parents=True, exist_ok=True)
        previous_parquet = self.out_dir / "train.parquet"
        appending = self.mode == "append" and previous_parquet.exists()
        if appending:
            self._check_append_schema(previous_parquet)
        if self.mode == "append" and (self.out_dir / "train.jsonl").exists():
            shutil.copyfile(self.out_dir / "train.jsonl", self._jsonl_path)
        self._jsonl = open(self._jsonl_path, "ab" if self.mode == "append" else "wb")  # noqa: SIM115
        self._parquet = pq.ParquetWriter(self._parquet_path, self.schema)
        if appending:
            # Parquet files cannot be appended to: stream the old row groups into the new file first.
            for batch in pq.ParquetFile(previous_parquet, pre_buffer=False).iter_batches(batch_size=self.batch_rows):
                self._parquet.write_batch(batch)
                self.rows_before += batch.num_rows
        return self

    def _check_append_schema(self, path: Path) -> None:
        import pyarrow.parquet as pq

        old = pq.read_schema(path)
        if old.names != self.schema.names:
            raise OutputExistsError(
                f"cannot append to {str(path)!r}: it has columns {old.names!r}, this run writes {self.schema.names!r}",
                hint="use the same --format (and --save-messages) as the previous run, or --overwrite",
            )

    def write(self, record: dict[str, Any]) -> None:
        try:
            line = orjson.dumps(record) + b"\n"
        except TypeError:  # a lone surrogate in model output: fall back to escaped ASCII JSON
            line = dumps_line(record).encode("utf-8")
        self._jsonl.write(line)
        for name, column in self._columns.items():
            column.append(record[name])
        self.rows_added += 1
        self._pending += 1
        if self._pending >= self.batch_rows:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._parquet.write_table(pa.Table.from_pydict(self._columns, schema=self.schema))
            self._columns = {name: [] for name in self.schema.names}
            self._pending = 0

    @property
    def total_rows(self) -> int:
        return self.rows_before + self.rows_added

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if exc_type is None:
                self._flush()
        finally:
            self._jsonl.close()
            self._parquet.close()
        if exc_type is not None:
            self._jsonl_path.unlink(missing_ok=True)
            self._parquet_path.unlink(missing_ok=True)
            return
        self._jsonl_path.replace(self.out_dir / "train.jsonl")
        self._parquet_path.replace(self.out_dir / "train.parquet")


def render_card(
    *,
    kind: Literal["sft", "dpo"],
    fmt: str,
    stats: DatagenStats,
    options: dict[str, Any],
    sources: list[str],
    total_rows: int,
    columns: list[str],
) -> str:
    """The dataset card (README.md): what is in the files, how it was selected, where from, how to load it."""
    title = "SFT" if kind == "sft" else "DPO preference"
    lines = [
        f"# {title} dataset (atropos {kind}-gen)",
        "",
        f"- format: `{fmt}`; columns: {', '.join(f'`{c}`' for c in columns)}",
        f"- rows: {total_rows} in `train.jsonl` and `train.parquet` (this run added {stats.rows_written})",
        f"- this run read {stats.groups_read} groups ({stats.rollouts_read} rollouts); "
        f"bad records skipped: {stats.bad_records}",
        "",
        "## Rollouts not in a row (this run)" if kind == "sft" else "## Rollouts by role (this run)",
        "",
        "| | rollouts |",
        "|---|---|",
    ]
    if kind != "sft":
        lines.append(f"| chosen (one per pair) | {stats.rows_written} |")
    lines += [f"| {label} | {count} |" for label, count in stats.breakdown(kind)] or ["| (none dropped) | 0 |"]
    lines += ["", "## Filters", ""]
    lines += [f"- `--{name.replace('_', '-')}`: {value!r}" for name, value in options.items()]
    lines += ["", "## Sources", ""]
    lines += [f"- `{source}`" for source in sources]
    lines += [
        "",
        "## Load",
        "",
        "```python",
        "from datasets import load_dataset",
        'ds = load_dataset("parquet", data_files="train.parquet")["train"]',
        "```",
        "",
    ]
    return "\n".join(lines)
