"""The jsonl and parquet sinks: what lands on disk, and jsonl <-> parquet giving back identical groups."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atropos_cli.errors import RecordError
from atropos_cli.formats.jsonl import JsonlWriter
from atropos_cli.formats.parquet import iter_parquet_groups, iter_parquet_results, write_parquet
from atropos_cli.formats.reader import iter_groups
from atropos_cli.types import GroupMeta, RolloutFailure, RolloutMeta, ScoredGroup


def chat(prompt: str, answer: str, **extra: object) -> list[dict]:
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer, **extra}]


def varied_groups() -> list[ScoredGroup]:
    """Hand-built groups covering the shapes that break naive serialisers."""
    full = ScoredGroup(
        tokens=[[1, 2, 3], [4, 5]],
        masks=[[-100, 2, 3], [-100, 5]],
        scores=[1.0, -0.25],
        advantages=[[0.5, 0.5, 0.5], [-0.5, -0.5]],
        ref_logprobs=[[-0.1, -0.2, -0.3], [-1e-9, -7.5]],
        inference_logprobs=[[0.0, -0.125, -3.0], [-0.3333333333333333, -2.0]],
        messages=[
            [{"role": "system", "content": "be brief"}, *chat("2+2?", "4", reward=1.0)],
            [{"role": "system", "content": "be brief"}, *chat("2+2?", "five", tool_calls=None, name="bot")],
        ],
        generation_params={"temperature": 0.7, "stop": ["\n"]},
        overrides=[{"set_advantage_to_zero": True}, {}],
        group_overrides={"weight": 2},
        images=["data:image/png;base64,AAAA"],
        env_id=3,
        distill_token_ids=[[[1, 2]], [[3, 4]]],
        distill_logprobs=[[[-0.1, -0.2]], [[-0.3, -0.4]]],
        meta=GroupMeta(
            group_id="g-1",
            env="arithmetic",
            env_version="1",
            item_id="train-7",
            model="tiny",
            sampling={"temperature": 0.7, "n": 2},
            seed=5,
            created_at=1700000000.25,
            duration_s=0.5,
            failed_rollouts=1,
            rollouts=[
                RolloutMeta(finish_reason="stop", reward_parts={"correct": 1.0}, completion_tokens=2),
                RolloutMeta(finish_reason="length", latency_s=0.1, custom={"k": [1, None]}),
            ],
            tokens_missing=False,
            run_note="extra group key",
        ),
    )
    no_tokens = ScoredGroup(
        scores=[0.0, 0.0, 1.0], messages=[chat("q", "a"), chat("q", "b"), chat("q", "c")], meta=GroupMeta()
    )
    unicode = ScoredGroup(
        scores=[0.5],
        messages=[chat("Ünïcödé ✓ 日本語 🙂 \u2028 </script>", "résumé\x00 \t\n <b>bold</b> & more")],
        meta=GroupMeta(item_id="ß-1", rollouts=[RolloutMeta()]),
    )
    bare = ScoredGroup(tokens=[[7], []], masks=[[7], []], scores=[2.0, -3.0])
    content_parts = ScoredGroup(
        scores=[1.0],
        messages=[
            [
                {"role": "user", "content": [{"type": "text", "text": "what is this?"}, {"type": "image_url"}]},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "function": {"name": "f"}}]},
            ]
        ],
    )
    no_assistant = ScoredGroup(scores=[1.0], messages=[[{"role": "user", "content": "only a prompt"}]])
    return [full, no_tokens, unicode, bare, content_parts, no_assistant]


def write_jsonl(path: Path, groups: list[ScoredGroup]) -> None:
    with JsonlWriter(path) as out:
        for group in groups:
            out.write(group)


def read_back(path: Path) -> list[ScoredGroup]:
    return [sourced.group for sourced in iter_groups([path], strict=True)]


# --- jsonl ---------------------------------------------------------------------------------------------


def test_jsonl_writer_writes_one_record_per_line_and_counts(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "run" / "groups.jsonl"
    groups = varied_groups()
    with JsonlWriter(path) as out:
        for group in groups:
            out.write(group)
        out.write(RolloutFailure(error_type="ValueError", error="bad reward", rollout_index=2))
        assert out.count == len(groups) + 1
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(groups) + 1
    assert json.loads(lines[1]) == groups[1].to_record()
    assert "advantages" not in json.loads(lines[1])  # empty optional keys are left out
    assert json.loads(lines[-1]) == {
        "kind": "group",
        "rollout_index": 2,
        "error_type": "ValueError",
        "error": "bad reward",
    }
    assert "日本語" in lines[2]  # unicode kept readable, not \u-escaped


def test_jsonl_writer_flushes_every_line(tmp_path: Path) -> None:
    path = tmp_path / "groups.jsonl"
    with JsonlWriter(path) as out:
        out.write(varied_groups()[3])
        # Another process reading now (e.g. `atropos view --serve`) already sees the complete line.
        assert path.read_text(encoding="utf-8").count("\n") == 1
        out.write(varied_groups()[3])
        assert path.read_text(encoding="utf-8").count("\n") == 2


def test_jsonl_append_keeps_lines_and_isolates_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "groups.jsonl"
    group = varied_groups()[3]
    write_jsonl(path, [group])
    with path.open("a", encoding="utf-8") as handle:
        handle.write('{"scores": [1.0], "tok')  # a crash mid-line
    with JsonlWriter(path, append=True) as out:
        out.write(group)
        assert out.count == 1
    bad: list = []
    got = [s.group for s in iter_groups([path], on_bad=bad.append)]
    assert got == [group, group]
    assert [b.location for b in bad] == [f"{path}:2"]


def test_jsonl_truncates_without_append(tmp_path: Path) -> None:
    path = tmp_path / "groups.jsonl"
    write_jsonl(path, varied_groups())
    write_jsonl(path, varied_groups()[:1])
    assert len(path.read_text(encoding="utf-8").splitlines()) == 1


def test_jsonl_lone_surrogate_still_writes_valid_utf8(tmp_path: Path) -> None:
    path = tmp_path / "groups.jsonl"
    group = ScoredGroup(scores=[1.0], messages=[chat("q", "torn \ud800 bytes")])
    write_jsonl(path, [group])
    path.read_bytes().decode("utf-8")  # valid UTF-8
    assert read_back(path) == [group]


# --- parquet -------------------------------------------------------------------------------------------


def test_jsonl_parquet_jsonl_round_trip_is_identical(tmp_path: Path) -> None:
    groups = varied_groups() * 3
    write_jsonl(tmp_path / "groups.jsonl", groups)
    from_jsonl = read_back(tmp_path / "groups.jsonl")
    assert from_jsonl == groups
    assert write_parquet(iter(from_jsonl), tmp_path / "groups.parquet") == len(groups)
    from_parquet = read_back(tmp_path / "groups.parquet")
    assert from_parquet == groups
    assert [g.to_record() for g in from_parquet] == [g.to_record() for g in groups]
    write_jsonl(tmp_path / "again.jsonl", from_parquet)
    assert (tmp_path / "again.jsonl").read_bytes() == (tmp_path / "groups.jsonl").read_bytes()


def test_parquet_has_one_row_per_rollout_with_browsable_columns(tmp_path: Path) -> None:
    groups = varied_groups()
    write_parquet(groups, tmp_path / "g.parquet")
    table = pq.read_table(tmp_path / "g.parquet")
    assert table.num_rows == sum(g.size for g in groups)
    assert str(table.schema.field("tokens").type) == "list<element: int64>"
    assert str(table.schema.field("rollout_index").type) == "int32"
    rows = table.to_pylist()
    assert [(r["group_index"], r["rollout_index"]) for r in rows[:5]] == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]
    first, second = rows[0], rows[1]
    assert (first["env"], first["item_id"], first["model"], first["score"]) == ("arithmetic", "train-7", "tiny", 1.0)
    assert first["prompt"] == "system: be brief\n\nuser: 2+2?"
    assert (first["completion"], second["completion"]) == ("4", "five")
    assert (first["finish_reason"], json.loads(first["reward_parts"])) == ("stop", {"correct": 1.0})
    assert json.loads(first["messages"])[-1] == {"role": "assistant", "content": "4", "reward": 1.0}
    # Large group-level blobs are stored once, on the group's first row.
    assert json.loads(first["images"]) == ["data:image/png;base64,AAAA"] and second["images"] is None
    assert first["generation_params"] == second["generation_params"]  # small group fields repeat
    parts_row = rows[sum(g.size for g in groups[:4])]
    assert parts_row["prompt"] == "user: what is this?[image]"
    assert parts_row["completion"] == '[{"id": "1", "function": {"name": "f"}}]'
    assert rows[-1]["completion"] is None and rows[-1]["prompt"] == "user: only a prompt"


def test_parquet_groups_straddling_batches_come_back_whole(tmp_path: Path) -> None:
    groups = [ScoredGroup(scores=[float(i)] * (1 + i % 4)) for i in range(40)]
    write_parquet(groups, tmp_path / "g.parquet")
    results = list(iter_parquet_results(tmp_path / "g.parquet", batch_rows=3))
    assert [group for _, group in results] == groups
    assert results[1][0] == 1 and results[2][0] == 3  # first row number of each group


def test_parquet_streams_in_row_groups(tmp_path: Path) -> None:
    groups = [ScoredGroup(scores=[1.0] * 8, messages=[chat("q", "a")] * 8) for _ in range(600)]
    write_parquet(iter(groups), tmp_path / "g.parquet")
    meta = pq.ParquetFile(tmp_path / "g.parquet").metadata
    assert meta.num_rows == 4800 and meta.num_row_groups >= 2
    assert sum(1 for _ in iter_parquet_groups(tmp_path / "g.parquet")) == 600


def test_reading_parquet_holds_one_row_group_at_a_time(tmp_path: Path) -> None:
    import pyarrow as pa

    groups = [ScoredGroup(scores=[1.0] * 8, tokens=[list(range(150))] * 8, masks=[[1] * 150] * 8)] * 1200
    write_parquet(groups, tmp_path / "g.parquet")
    peak = 0
    for _ in iter_parquet_groups(tmp_path / "g.parquet"):
        peak = max(peak, pa.total_allocated_bytes())
    whole = pq.read_table(tmp_path / "g.parquet").nbytes
    assert pq.ParquetFile(tmp_path / "g.parquet").metadata.num_row_groups >= 4
    assert peak < whole / 2, f"streaming held {peak} bytes of arrow memory; the whole table is {whole}"


def test_write_parquet_leaves_no_file_when_the_source_fails(tmp_path: Path) -> None:
    def broken():
        yield varied_groups()[0]
        raise RuntimeError("source died")

    with pytest.raises(RuntimeError):
        write_parquet(broken(), tmp_path / "g.parquet")
    assert list(tmp_path.iterdir()) == []


def test_write_parquet_of_nothing_is_a_valid_empty_file(tmp_path: Path) -> None:
    assert write_parquet([], tmp_path / "empty.parquet") == 0
    assert pq.read_table(tmp_path / "empty.parquet").num_rows == 0
    assert list(iter_parquet_groups(tmp_path / "empty.parquet")) == []


def test_parquet_rows_out_of_order_are_a_record_error(tmp_path: Path) -> None:
    write_parquet(varied_groups()[:2], tmp_path / "g.parquet")
    table = pq.read_table(tmp_path / "g.parquet")
    rows = table.to_pylist()
    rows[0], rows[1] = rows[1], rows[0]
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), tmp_path / "bad.parquet")
    with pytest.raises(RecordError, match=r"bad\.parquet:row 0: .*rollout_index is 1, expected 0"):
        list(iter_parquet_groups(tmp_path / "bad.parquet"))


def test_parquet_is_readable_by_pandas_and_datasets_offline(tmp_path: Path) -> None:
    import pandas as pd

    write_parquet(varied_groups(), tmp_path / "g.parquet")
    frame = pd.read_parquet(tmp_path / "g.parquet")
    assert len(frame) == 10 and frame["score"].tolist()[:2] == [1.0, -0.25]
    script = (
        "import datasets, json, sys\n"
        "ds = datasets.load_dataset('parquet', data_files=sys.argv[1], split='train', cache_dir=sys.argv[2])\n"
        "print(json.dumps([len(ds), ds[0]['completion'], ds[0]['tokens']]))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "g.parquet"), str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [10, "4", [1, 2, 3]]


# --- property: any group survives jsonl and parquet ------------------------------------------------------

_text = st.text(max_size=12)
_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), _text)
_floats = st.floats(allow_nan=False, allow_infinity=False, width=64)


@st.composite
def scored_groups(draw: st.DrawFn) -> ScoredGroup:
    n = draw(st.integers(1, 4))
    lengths = [draw(st.integers(0, 4)) for _ in range(n)]
    data: dict = {"scores": draw(st.lists(_floats, min_size=n, max_size=n))}
    if draw(st.booleans()):
        data["tokens"] = [draw(st.lists(st.integers(0, 2**40), min_size=k, max_size=k)) for k in lengths]
        data["masks"] = [draw(st.lists(st.integers(-100, 9), min_size=k, max_size=k)) for k in lengths]
        if draw(st.booleans()):
            data["inference_logprobs"] = [draw(st.lists(_floats, min_size=k, max_size=k)) for k in lengths]
    if draw(st.booleans()):
        message = st.fixed_dictionaries(
            {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": _text},
            optional={"name": _text, "reward": _json_leaf},
        )
        data["messages"] = [draw(st.lists(message, max_size=3)) for _ in range(n)]
    if draw(st.booleans()):
        data["overrides"] = [draw(st.dictionaries(_text, _json_leaf, max_size=2)) for _ in range(n)]
    data["env_id"] = draw(st.none() | st.integers(0, 9))
    data["images"] = draw(st.none() | st.lists(_text, max_size=2))
    if draw(st.booleans()):
        rollouts = (
            [
                {
                    "finish_reason": draw(st.none() | _text),
                    "reward_parts": draw(st.none() | st.dictionaries(_text, _floats, max_size=2)),
                }
                for _ in range(n)
            ]
            if draw(st.booleans())
            else None
        )
        data["meta"] = {
            "item_id": draw(st.none() | _text),
            "seed": draw(st.none() | st.integers(0, 9)),
            "rollouts": rollouts,
            "extra": draw(_json_leaf),
        }
    return ScoredGroup.model_validate(data)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(groups=st.lists(scored_groups(), min_size=1, max_size=4))
def test_any_group_round_trips_through_jsonl_and_parquet(tmp_path: Path, groups: list[ScoredGroup]) -> None:
    write_jsonl(tmp_path / "p.jsonl", groups)
    from_jsonl = read_back(tmp_path / "p.jsonl")
    # jsonl drops meta keys whose value is None (to_record), so compare records there, models after.
    assert [g.to_record() for g in from_jsonl] == [g.to_record() for g in groups]
    write_parquet(from_jsonl, tmp_path / "p.parquet")
    assert read_back(tmp_path / "p.parquet") == from_jsonl
    write_parquet(groups, tmp_path / "direct.parquet")
    assert read_back(tmp_path / "direct.parquet") == groups
