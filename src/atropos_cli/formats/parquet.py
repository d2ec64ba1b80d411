"""The parquet sink and source: scored groups as a table of ONE ROW PER ROLLOUT, streamed both ways.

Flow: at the end of `atropos process`, `write_parquet(iter of groups.jsonl)` writes `groups.parquet` beside
it; `readers.iter_groups` reads it back (also for `atropos view`, `sft-gen`, `dpo-gen`). jsonl -> parquet ->
ScoredGroup is exact: reading a parquet file gives groups equal to the ones written.

What one row is: one rollout (one completion of one item) of one group. The rows of a group are contiguous
and ordered by `rollout_index`; group-level columns are repeated on every row of the group, so a row can be
filtered or sampled on its own (pandas, `datasets`, DuckDB) and `group_index` puts the groups back together.

  group_index (int64)      position of the group in the file, 0-based
  rollout_index (int32)    position of the rollout in its group, 0-based
  group_id, env, env_version, item_id, model (string)   provenance, from `meta` (null when unknown)
  score (float64)          the rollout's reward
  prompt (string)          derived: the messages before the last assistant message, as "role: content"
                           paragraphs (browsing only; never read back)
  completion (string)      derived: the content of the last assistant message (browsing only)
  finish_reason (string), completion_tokens (int64), reward_parts (JSON object)   per-rollout diagnostics
  messages (JSON string)   the rollout's full chat, exactly as in the jsonl (extra message keys kept)
  tokens, masks (list<int64>)   token ids and training masks (-100 = not trained); null when the run kept
                           no token ids
  inference_logprobs, advantages, ref_logprobs (list<float64>)   per-token values, null when absent
  overrides (JSON object)  Atropos' per-rollout overrides
  rollout_meta (JSON object)   the rest of the rollout's meta (latency_s, extra keys); null when the group
                           has no per-rollout meta
  env_id (int64), generation_params, group_overrides (JSON)   Atropos' group-level fields, repeated
  meta (JSON object)       the rest of the group's meta (sampling, seed, created_at, duration_s,
                           failed_rollouts, tokens_missing, extra keys); null when the group has no meta
  images, distill_token_ids, distill_logprobs (JSON)   large group-level blobs: stored ONCE, on the
                           group's first row (rollout_index 0), null on the others

Rows are written in row groups of about `ROWS_PER_CHUNK` rows (zstd) and read back batch by batch, so memory
stays flat whatever the file size.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from atropos_cli.errors import RecordError
from atropos_cli.formats.jsonl import dumps_compact
from atropos_cli.formats.text import clean_text, content_text, render_chat, split_completion
from atropos_cli.types import GroupMeta, RolloutMeta, ScoredGroup, describe_validation_error

__all__ = [
    "write_parquet",
    "iter_parquet_groups",
    "iter_parquet_results",
    "append_group",
    "parquet_schema",
    "REQUIRED_COLUMNS",
]

ROWS_PER_CHUNK = 2048
FORMAT_TAG = b"atropos.rollouts/1"
META_COLUMNS = ("group_id", "env", "env_version", "item_id", "model")
ROLLOUT_COLUMNS = ("finish_reason", "completion_tokens", "reward_parts")
TOKEN_LISTS = ("tokens", "masks")
FLOAT_LISTS = ("inference_logprobs", "advantages", "ref_logprobs")
GROUP_JSON = ("generation_params", "group_overrides")
FIRST_ROW_JSON = ("images", "distill_token_ids", "distill_logprobs")
REQUIRED_COLUMNS = ("group_index", "rollout_index", "score")


def parquet_schema() -> Any:
    """The fixed arrow schema, so every file has the same columns even when a column is all null."""
    import pyarrow as pa

    ints, floats = pa.list_(pa.int64()), pa.list_(pa.float64())
    fields = [
        ("group_index", pa.int64()),
        ("rollout_index", pa.int32()),
        *[(name, pa.string()) for name in META_COLUMNS],
        ("score", pa.float64()),
        ("prompt", pa.string()),
        ("completion", pa.string()),
        ("finish_reason", pa.string()),
        ("completion_tokens", pa.int64()),
        ("reward_parts", pa.string()),
        ("messages", pa.string()),
        *[(name, ints) for name in TOKEN_LISTS],
        *[(name, floats) for name in FLOAT_LISTS],
        ("overrides", pa.string()),
        ("rollout_meta", pa.string()),
        ("env_id", pa.int64()),
        *[(name, pa.string()) for name in GROUP_JSON],
        ("meta", pa.string()),
        *[(name, pa.string()) for name in FIRST_ROW_JSON],
    ]
    return pa.schema(fields, metadata={b"atropos.format": FORMAT_TAG})


def _json_or_none(value: Any) -> str | None:
    return None if value is None else dumps_compact(value)


def _rest_of(model: GroupMeta | RolloutMeta, skip: tuple[str, ...]) -> dict[str, Any]:
    """The model's fields minus `skip`: declared fields that are None are left out, extra keys all kept."""
    rest = {k: v for k, v in model.__dict__.items() if k not in skip and v is not None}
    rest.update(model.__pydantic_extra__ or {})
    return rest


def _derived_text(chat: list[dict[str, Any]]) -> tuple[str, str | None]:
    before, last = split_completion(chat)
    return clean_text(render_chat(before)), None if last is None else content_text(last)


def _append_rollout_columns(cols: dict[str, list[Any]], group: ScoredGroup) -> None:
    n, none = group.size, [None] * group.size
    cols["rollout_index"].extend(range(n))
    cols["score"].extend(group.scores)
    if group.messages is None:
        for name in ("prompt", "completion", "messages"):
            cols[name].extend(none)
    else:
        texts = [_derived_text(chat) for chat in group.messages]
        cols["prompt"].extend(t[0] for t in texts)
        cols["completion"].extend(t[1] for t in texts)
        cols["messages"].extend(dumps_compact(chat) for chat in group.messages)
    for name in TOKEN_LISTS:
        cols[name].extend(getattr(group, name) or none)  # [] means "no token ids": null, not empty lists
    for name in FLOAT_LISTS:
        values = getattr(group, name)
        cols[name].extend(none if values is None else values)
    cols["overrides"].extend(none if group.overrides is None else (dumps_compact(o) for o in group.overrides))
    rollouts = group.meta.rollouts if group.meta is not None else None
    if rollouts is None:
        for name in (*ROLLOUT_COLUMNS, "rollout_meta"):
            cols[name].extend(none)
    else:
        cols["finish_reason"].extend(r.finish_reason for r in rollouts)
        cols["completion_tokens"].extend(r.completion_tokens for r in rollouts)
        cols["reward_parts"].extend(_json_or_none(r.reward_parts) for r in rollouts)
        cols["rollout_meta"].extend(dumps_compact(_rest_of(r, ROLLOUT_COLUMNS)) for r in rollouts)


def _append_group_columns(cols: dict[str, list[Any]], index: int, group: ScoredGroup) -> None:
    n, meta = group.size, group.meta
    cols["group_index"].extend([index] * n)
    cols["env_id"].extend([group.env_id] * n)
    for name in META_COLUMNS:
        cols[name].extend([None if meta is None else getattr(meta, name)] * n)
    rest = None if meta is None else dumps_compact(_rest_of(meta, (*META_COLUMNS, "rollouts")))
    cols["meta"].extend([rest] * n)
    for name in GROUP_JSON:
        cols[name].extend([_json_or_none(getattr(group, name))] * n)
    for name in FIRST_ROW_JSON:
        cols[name].append(_json_or_none(getattr(group, name)))
        cols[name].extend([None] * (n - 1))


def append_group(cols: dict[str, list[Any]], index: int, group: ScoredGroup) -> None:
    """Append the rows of one group to column lists (see the module docstring for what each column holds)."""
    _append_group_columns(cols, index, group)
    _append_rollout_columns(cols, group)


def write_parquet(groups: Iterable[ScoredGroup], path: Path) -> int:
    """Stream `groups` into a parquet file at `path` (one row per rollout); returns the number of groups.

    The file is written beside `path` and moved into place at the end, so a failure never leaves a torn
    parquet file behind (a reader would reject it: the footer is written last).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    schema = parquet_schema()
    tmp = path.with_name(f".{path.name}.tmp")
    count = 0
    try:
        with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
            cols: dict[str, list[Any]] = {name: [] for name in schema.names}
            for group in groups:
                append_group(cols, count, group)
                count += 1
                if len(cols["score"]) >= ROWS_PER_CHUNK:
                    writer.write_table(pa.Table.from_pydict(cols, schema=schema))
                    cols = {name: [] for name in schema.names}
            if cols["score"]:
                writer.write_table(pa.Table.from_pydict(cols, schema=schema))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return count


def _loads(value: str | None) -> Any:
    if value is None:
        return None
    try:
        return orjson.loads(value)  # ~3x json.loads on the messages column, the bulk of a read
    except orjson.JSONDecodeError:
        return json.loads(value)  # NaN / Infinity, which orjson refuses


Columns = dict[str, list[Any]]


def _first(cols: Columns, name: str) -> Any:
    values = cols.get(name)
    return values[0] if values else None


def _at(cols: Columns, name: str, j: int) -> Any:
    values = cols.get(name)
    return values[j] if values is not None else None


def _meta_from_columns(cols: Columns, n: int) -> dict[str, Any] | None:
    if _first(cols, "meta") is None:
        return None
    meta: dict[str, Any] = _loads(_first(cols, "meta"))
    for name in META_COLUMNS:
        if _first(cols, name) is not None:
            meta[name] = _first(cols, name)
    if any(v is not None for v in cols.get("rollout_meta") or []):
        rollouts = []
        for j in range(n):
            rollout = _loads(_at(cols, "rollout_meta", j))
            if rollout is not None:
                for name in ("finish_reason", "completion_tokens"):
                    if _at(cols, name, j) is not None:
                        rollout[name] = _at(cols, name, j)
                if _at(cols, "reward_parts", j) is not None:
                    rollout["reward_parts"] = _loads(_at(cols, "reward_parts", j))
            rollouts.append(rollout)
        meta["rollouts"] = rollouts
    return meta


def group_from_columns(cols: Columns) -> ScoredGroup:
    """Rebuild one group from its rows, given column-wise (name -> one value per rollout); raises ValueError
    (incl. pydantic's) when they do not form one."""
    n = len(cols["group_index"])
    for j in range(n):
        if _at(cols, "rollout_index", j) != j:
            raise ValueError(f"rollout_index is {_at(cols, 'rollout_index', j)!r}, expected {j} (rows out of order)")
    data: dict[str, Any] = {"scores": cols.get("score") or [None] * n, "env_id": _first(cols, "env_id")}
    for name in (*TOKEN_LISTS, *FLOAT_LISTS):
        values = cols.get(name)
        if values is not None and any(v is not None for v in values):
            data[name] = values
    for name in ("messages", "overrides"):
        values = cols.get(name)
        if values is not None and any(v is not None for v in values):
            data[name] = [_loads(v) for v in values]
    for name in (*GROUP_JSON, *FIRST_ROW_JSON):
        data[name] = _loads(_first(cols, name))
    data["meta"] = _meta_from_columns(cols, n)
    return ScoredGroup.model_validate(data)


def _check_columns(path: Path, names: list[str]) -> None:
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        raise RecordError(
            f"{str(path)!r} is not a rollouts parquet file: missing column(s) {', '.join(missing)}",
            hint="pass a groups.parquet written by `atropos process` (one row per rollout: "
            "group_index, rollout_index, score, ...), or the run's groups.jsonl",
        )


def _iter_batches(path: Path, batch_rows: int) -> Iterator[Columns]:
    """The file's rows, a batch at a time, column-wise (no dict per row: that was most of a read's time)."""
    import pyarrow.parquet as pq

    try:
        # pre_buffer=False: the default pre-buffers every row group's column chunks, so RSS grew with the file.
        handle = pq.ParquetFile(path, pre_buffer=False)
    except (OSError, ValueError) as exc:  # pyarrow raises ArrowInvalid (a ValueError) for a non-parquet file
        raise RecordError(
            f"cannot read {str(path)!r} as parquet: {exc}",
            hint="the file may be torn (a run that stopped mid-write) or not parquet; use the run's groups.jsonl",
        ) from None
    with handle:
        names = handle.schema_arrow.names
        _check_columns(path, names)
        # The derived `prompt`/`completion` columns are never read back: skipping them saves ~10% of the read.
        wanted = [name for name in names if name not in ("prompt", "completion")]
        for batch in handle.iter_batches(batch_size=batch_rows, columns=wanted):
            yield {name: batch.column(name).to_pylist() for name in batch.schema.names}


def _runs(keys: list[Any]) -> Iterator[tuple[int, int]]:
    """[start, end) of each run of equal consecutive keys."""
    start = 0
    for i in range(1, len(keys) + 1):
        if i == len(keys) or keys[i] != keys[start]:
            yield start, i
            start = i


def iter_parquet_results(path: Path, batch_rows: int = 1024) -> Iterator[tuple[int, ScoredGroup | str]]:
    """(first row number, group) per group, or (row number, reason) for rows that do not form a valid group."""
    pending: Columns | None = None
    start = row_number = 0
    for cols in _iter_batches(Path(path), batch_rows):
        keys = cols["group_index"]
        for a, b in _runs(keys):
            chunk = {name: values[a:b] for name, values in cols.items()}
            if pending is not None and pending["group_index"][0] == keys[a]:  # a group split across batches
                for name, values in chunk.items():
                    pending[name].extend(values)
                continue
            if pending is not None:
                yield start, _rebuild(pending)
            pending, start = chunk, row_number + a
        row_number += len(keys)
    if pending is not None:
        yield start, _rebuild(pending)


def _rebuild(cols: Columns) -> ScoredGroup | str:
    try:
        return group_from_columns(cols)
    except ValidationError as exc:
        return f"not a valid group: {describe_validation_error(exc)}"
    except (ValueError, TypeError) as exc:  # json.JSONDecodeError is a ValueError
        return f"not a valid group: {exc}"


def iter_parquet_groups(path: Path) -> Iterator[ScoredGroup]:
    """Stream the groups of a parquet file written by `write_parquet`; a bad group raises RecordError."""
    for row_number, result in iter_parquet_results(path):
        if isinstance(result, str):
            raise RecordError(
                f"{path}:row {row_number}: {result}",
                hint="the file was not written by `atropos process`, or was edited; re-create it from groups.jsonl",
            )
        yield result
