"""Reading groups back: inputs -> files, bad lines reported and skipped, non-rollout files refused, legacy jsonl."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from atropos_cli.errors import RecordError
from atropos_cli.formats.jsonl import JsonlWriter
from atropos_cli.formats.parquet import write_parquet
from atropos_cli.formats.reader import BadRecord, SourcedGroup, expand_inputs, iter_groups
from atropos_cli.types import GroupMeta, ScoredGroup


def group(score: float = 1.0, n: int = 2, item: str = "i") -> ScoredGroup:
    return ScoredGroup(
        scores=[score] * n,
        messages=[[{"role": "user", "content": "q"}, {"role": "assistant", "content": f"a{j}"}] for j in range(n)],
        meta=GroupMeta(item_id=item),
    )


def make_run(directory: Path, groups: list[ScoredGroup]) -> Path:
    with JsonlWriter(directory / "groups.jsonl") as out:
        for g in groups:
            out.write(g)
    return directory


def read_all(paths: list[Path], **kwargs) -> tuple[list[SourcedGroup], list[BadRecord]]:
    bad: list[BadRecord] = []
    return list(iter_groups(paths, on_bad=bad.append, **kwargs)), bad


# --- expand_inputs -------------------------------------------------------------------------------------


def test_a_run_dir_gives_its_jsonl_else_its_parquet(tmp_path: Path) -> None:
    run = make_run(tmp_path / "a", [group()])
    write_parquet([group()], run / "groups.parquet")
    assert expand_inputs([str(run)]) == [run / "groups.jsonl"]
    (run / "groups.jsonl").unlink()
    assert expand_inputs([str(run)]) == [run / "groups.parquet"]


def test_files_globs_and_several_inputs_in_order_without_repeats(tmp_path: Path) -> None:
    runs = [make_run(tmp_path / "runs" / name, [group()]) for name in ("b", "a", "c")]
    (tmp_path / "runs" / "empty").mkdir()  # a glob skips dirs that hold no groups
    expected = [tmp_path / "runs" / n / "groups.jsonl" for n in ("a", "b", "c")]
    assert expand_inputs([str(tmp_path / "runs" / "*")]) == expected
    assert expand_inputs([str(runs[0]), str(runs[0] / "groups.jsonl"), str(tmp_path / "runs/*/groups.jsonl")]) == [
        expected[1],
        expected[0],
        expected[2],
    ]


@pytest.mark.parametrize(
    ("raw", "message", "hint"),
    [
        ("missing.jsonl", "no such file or directory: '.*missing.jsonl'", "run directory"),
        ("nothing*/x", "matched no groups file or run directory", "check the pattern"),
        ("emptydir", "no groups.jsonl or groups.parquet in", "written by `atropos process`"),
    ],
)
def test_inputs_that_find_nothing_say_so_with_a_hint(tmp_path: Path, raw: str, message: str, hint: str) -> None:
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(RecordError, match=message) as info:
        expand_inputs([str(tmp_path / raw)])
    assert hint in (info.value.hint or "")


def test_no_input_at_all_is_an_error() -> None:
    with pytest.raises(RecordError, match="no input given"):
        expand_inputs([])


# --- jsonl ---------------------------------------------------------------------------------------------


def test_groups_come_with_source_and_index(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a", [group(1.0), group(0.0)])
    b = make_run(tmp_path / "b", [group(-1.0)])
    got, bad = read_all([a / "groups.jsonl", b / "groups.jsonl"])
    assert bad == []
    assert [(s.source, s.index, s.group.scores[0]) for s in got] == [
        (str(a / "groups.jsonl"), 0, 1.0),
        (str(a / "groups.jsonl"), 1, 0.0),
        (str(b / "groups.jsonl"), 0, -1.0),
    ]


def test_bad_lines_are_reported_with_file_line_and_skipped(tmp_path: Path) -> None:
    path = tmp_path / "groups.jsonl"
    good = json.dumps(group().to_record())
    mismatched = json.dumps({"scores": [1.0, 2.0], "tokens": [[1]], "masks": [[1]]})
    path.write_text(f"{good}\nnot json at all\n\n{mismatched}\n[1, 2]\n{good}\n", encoding="utf-8")
    got, bad = read_all([path])
    assert [s.index for s in got] == [0, 1]
    assert [b.location for b in bad] == [f"{path}:2", f"{path}:4", f"{path}:5"]
    assert bad[0].reason.startswith("not valid JSON (Expecting value")
    assert "tokens has 1 rollouts but scores has 2" in bad[1].reason
    assert bad[2].reason == "not a group: expected a JSON object, got list"


def test_a_torn_last_line_is_reported_as_incomplete(tmp_path: Path) -> None:
    path = tmp_path / "groups.jsonl"
    line = json.dumps(group().to_record())
    path.write_text(f"{line}\n{line[:25]}", encoding="utf-8")
    got, bad = read_all([path])
    assert len(got) == 1
    assert bad == [BadRecord(f"{path}:2", bad[0].reason)]
    assert bad[0].reason.startswith("incomplete last line (the writer stopped mid-line?): not valid JSON")


def test_a_complete_last_line_without_newline_is_read(tmp_path: Path) -> None:
    path = tmp_path / "groups.jsonl"
    path.write_text(json.dumps(group().to_record()), encoding="utf-8")
    assert len(read_all([path])[0]) == 1


def test_strict_raises_on_the_first_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "groups.jsonl"
    path.write_text(json.dumps(group().to_record()) + "\n{oops\n", encoding="utf-8")
    with pytest.raises(RecordError, match=r"groups\.jsonl:2: not valid JSON"):
        list(iter_groups([path], strict=True))


def test_bad_lines_before_the_first_group_are_reported_once_a_group_shows_up(tmp_path: Path) -> None:
    path = tmp_path / "groups.jsonl"
    path.write_text("garbage\n" + json.dumps(group().to_record()) + "\n", encoding="utf-8")
    got, bad = read_all([path])
    assert len(got) == 1 and [b.location for b in bad] == [f"{path}:1"]


def test_a_jsonl_file_that_is_not_rollouts_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "failures.jsonl"
    path.write_text('{"error_type": "X", "error": "boom"}\n' * 3, encoding="utf-8")
    bad: list[BadRecord] = []
    with pytest.raises(
        RecordError, match="holds no scored groups .*failures.jsonl:1: .*scores: Field required"
    ) as info:
        list(iter_groups([path], on_bad=bad.append))
    assert "failures.jsonl and SFT/DPO datasets are not rollouts" in (info.value.hint or "")
    assert bad == []  # one clear error, not a warning per line


def test_an_empty_jsonl_file_has_no_groups(tmp_path: Path) -> None:
    (tmp_path / "groups.jsonl").write_text("", encoding="utf-8")
    assert read_all([tmp_path / "groups.jsonl"]) == ([], [])


def test_gzipped_jsonl_is_read(tmp_path: Path) -> None:
    path = tmp_path / "groups.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write(json.dumps(group().to_record()) + "\n")
    assert [s.group for s in read_all([path])[0]] == [group()]


def test_atropos_legacy_process_jsonl_reads(tmp_path: Path) -> None:
    # As Atropos' process mode writes it: no meta, nulls for unset keys, env extras, and `messages` holding
    # one synthesized user message per rollout (not one chat per rollout).
    legacy = {
        "tokens": [[1, 2, 3], [1, 2, 4]],
        "masks": [[-100, 2, 3], [-100, 2, 4]],
        "scores": [1.0, -1.0],
        "inference_logprobs": [[1.0, -0.5, -0.25], [1.0, -0.5, -2.0]],
        "advantages": None,
        "ref_logprobs": None,
        "overrides": None,
        "group_overrides": None,
        "distill_token_ids": None,
        "distill_logprobs": None,
        "images": None,
        "messages": [{"role": "user", "content": "Q: 2+2 A: 4"}, {"role": "user", "content": "Q: 2+2 A: 5"}],
        "env_specific": "kept out",
    }
    nested = {**legacy, "messages": [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "4"}]] * 2}
    strings = {**legacy, "messages": ["decoded one", "decoded two"]}
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in (legacy, nested, strings)), encoding="utf-8")
    got = [s.group for s in iter_groups([path], strict=True)]
    assert got[0].messages == [
        [{"role": "user", "content": "Q: 2+2 A: 4"}],
        [{"role": "user", "content": "Q: 2+2 A: 5"}],
    ]
    assert got[0].tokens == legacy["tokens"] and got[0].meta is None and got[0].scores == [1.0, -1.0]
    assert got[1].messages == nested["messages"]
    assert got[2].messages == [
        [{"role": "user", "content": "decoded one"}],
        [{"role": "user", "content": "decoded two"}],
    ]


# --- parquet -------------------------------------------------------------------------------------------


def test_parquet_reads_like_jsonl_and_reports_bad_groups_by_row(tmp_path: Path) -> None:
    groups = [group(1.0), group(0.5, n=3), group(0.0)]
    write_parquet(groups, tmp_path / "g.parquet")
    table = pq.read_table(tmp_path / "g.parquet")
    rows = table.to_pylist()
    rows[3]["messages"] = "{not json"  # the second group's second row
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), tmp_path / "bad.parquet")
    got, bad = read_all([tmp_path / "bad.parquet"])
    assert [s.group for s in got] == [groups[0], groups[2]] and [s.index for s in got] == [0, 1]
    assert [b.location for b in bad] == [f"{tmp_path / 'bad.parquet'}:row 2"]
    assert bad[0].reason.startswith("not a valid group:")


def test_a_parquet_file_without_rollout_columns_is_refused(tmp_path: Path) -> None:
    pq.write_table(pa.table({"prompt": ["a"], "chosen": ["b"]}), tmp_path / "dpo.parquet")
    with pytest.raises(RecordError, match="not a rollouts parquet file: missing column.*group_index") as info:
        list(iter_groups([tmp_path / "dpo.parquet"]))
    assert "one row per rollout" in (info.value.hint or "")


def test_a_torn_parquet_file_is_a_record_error(tmp_path: Path) -> None:
    write_parquet([group()], tmp_path / "g.parquet")
    data = (tmp_path / "g.parquet").read_bytes()
    (tmp_path / "torn.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(RecordError, match="cannot read .*torn.parquet.* as parquet"):
        list(iter_groups([tmp_path / "torn.parquet"]))
