"""Selection rules of sft-gen / dpo-gen on hand-built groups, and the dataset files they produce."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from atropos_cli.datagen.samples import split_messages
from atropos_cli.datagen.select import (
    DatagenStats,
    DpoOptions,
    DropReason,
    SftOptions,
    select_dpo,
    select_sft,
)
from atropos_cli.errors import OutputExistsError, RecordError
from atropos_cli.formats.dataset import DatasetWriter, render_card, row_formatter, schema_for
from atropos_cli.types import GroupMeta, ScoredGroup


@dataclass
class Item:
    source: str
    index: int
    group: ScoredGroup


def chat(question: str, answer: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": question},
        {"role": "assistant", "content": answer},
    ]


def group(scores: list[float], gid: str = "g0", answers: list[str] | None = None) -> Item:
    answers = answers or [f"answer {i}" for i in range(len(scores))]
    return Item(
        "runs/a/groups.jsonl",
        0,
        ScoredGroup(
            scores=scores,
            messages=[chat(f"question {gid}", a) for a in answers],
            meta=GroupMeta(group_id=gid, env="arithmetic", model="tiny", item_id=f"item-{gid}"),
        ),
    )


def sft(items: list[Item], **options: object) -> tuple[list, DatagenStats]:
    stats = DatagenStats()
    rows = list(select_sft(items, SftOptions(**options), stats))
    assert stats.rollouts_read == stats.rows_written + sum(stats.dropped.values())
    return rows, stats


def dpo(items: list[Item], **options: object) -> tuple[list, DatagenStats]:
    stats = DatagenStats()
    rows = list(select_dpo(items, DpoOptions(**options), stats))
    assert stats.rollouts_read == stats.rows_written + stats.rejected_only + sum(stats.dropped.values())
    return rows, stats


def answers(rows: list) -> list[str]:
    return [row.sample.completion[0]["content"] for row in rows]


def test_sft_keeps_top_n_by_score_and_drops_non_positive() -> None:
    rows, stats = sft([group([0.2, 1.0, 0.0, 0.5, -1.0])], save_top_n_per_group=2)
    assert answers(rows) == ["answer 1", "answer 3"]
    assert [r.score for r in rows] == [1.0, 0.5]
    assert stats.dropped == {"score <= 0": 2, "over the per-group limit": 1}


def test_sft_ties_keep_original_order() -> None:
    rows, _ = sft([group([1.0, 1.0, 1.0, 1.0])], save_top_n_per_group=3)
    assert answers(rows) == ["answer 0", "answer 1", "answer 2"]


def test_sft_all_equal_scores_with_margin_keep_nothing() -> None:
    rows, stats = sft([group([1.0, 1.0, 1.0])], minimum_score_diff_max_min=0.1)
    assert rows == []
    assert stats.dropped == {"margin too small": 3}


def test_sft_margin_is_strictly_above_group_minimum() -> None:
    rows, _ = sft([group([1.0, 0.5, 0.1])], minimum_score_diff_max_min=0.4)
    # 1.0 - 0.1 = 0.9 > 0.4 kept; 0.5 - 0.1 = 0.4 is not > 0.4.
    assert answers(rows) == ["answer 0"]


def test_sft_negative_scores_allowed() -> None:
    rows, stats = sft([group([-0.5, -2.0, 0.0])], allow_negative_scores=True, save_top_n_per_group=3)
    assert [r.score for r in rows] == [0.0, -0.5, -2.0]
    assert stats.dropped == {}


def test_sft_min_score_and_single_rollout_group() -> None:
    rows, stats = sft([group([0.4], gid="a"), group([0.9], gid="b")], min_score=0.5)
    assert [r.provenance.group_id for r in rows] == ["b"]
    assert stats.dropped == {"below --min-score": 1}
    rows, stats = sft([group([0.9])], minimum_score_diff_max_min=0.1)
    assert rows == [] and stats.dropped == {"margin too small": 1}


def test_sft_dedupe_then_takes_next_best() -> None:
    rows, stats = sft([group([1.0, 0.9, 0.8], answers=["same", "same", "other"])], save_top_n_per_group=2)
    assert answers(rows) == ["same", "other"]
    assert stats.dropped == {"duplicate": 1}
    rows, _ = sft([group([1.0, 0.9], answers=["same", "same"])], dedupe=False)
    assert answers(rows) == ["same", "same"]


def test_sft_dedupe_across_groups_and_num_seqs_limit() -> None:
    items = [group([1.0, 0.5], gid="x"), group([1.0, 0.5], gid="x"), group([1.0], gid="y"), group([1.0], gid="z")]
    rows, stats = sft(items, num_seqs_to_save=3)
    assert [(r.provenance.group_id, r.sample.completion[0]["content"]) for r in rows] == [
        ("x", "answer 0"),
        ("x", "answer 1"),
        ("y", "answer 0"),
    ]
    assert stats.groups_read == 3  # the fourth group is never read
    assert stats.dropped == {"duplicate": 2}


def test_sft_too_long_and_unparseable() -> None:
    item = group([1.0, 0.9, 0.8], answers=["x" * 50, "short", "ok"])
    item.group.messages[2] = [{"role": "user", "content": "no answer"}]
    rows, stats = sft([item], max_chars=40)
    assert answers(rows) == ["short"]
    assert stats.dropped == {"too long": 1, "unparseable": 1}


def test_split_messages_multi_turn_and_tools() -> None:
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "calling", "tool_calls": []},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."},
    ]
    prompt, completion = split_messages(messages)
    assert prompt == [{"role": "user", "content": "weather?"}]
    assert [m["role"] for m in completion] == ["assistant", "tool", "assistant"]
    with pytest.raises(ValueError, match="non-text content"):
        split_messages([{"role": "user", "content": [{"type": "image"}]}, {"role": "assistant", "content": "x"}])


def test_dpo_pairs_respect_margin_and_pool() -> None:
    rows, stats = dpo([group([1.0, 0.8, 0.3, 0.0])], save_n_pairs_per_group=2, minimum_score_diff_max_min=0.5)
    # Pool = two lowest (0.0, 0.3). 1.0 can pair with either; 0.8 needs < 0.3, so only 0.0 if still free.
    pairs = [(r.score, r.rejected_score) for r in rows]
    assert pairs[0][0] == 1.0 and pairs[0][1] in (0.0, 0.3)
    assert len(rows) + stats.dropped.get("margin too small", 0) == 2
    for row in rows:
        assert row.prompt[-1] == {"role": "user", "content": "question g0"}
        assert row.chosen.completion != row.rejected.completion


def test_dpo_is_deterministic_per_seed() -> None:
    items = [group([1.0, 0.9, 0.1, 0.0, 0.05], gid=f"g{i}") for i in range(20)]
    first, _ = dpo(items, seed=7, minimum_score_diff_max_min=0.1)
    again, _ = dpo(items, seed=7, minimum_score_diff_max_min=0.1)
    other, _ = dpo(items, seed=8, minimum_score_diff_max_min=0.1)
    key = [(r.provenance.group_id, r.score, r.rejected_score) for r in first]
    assert key == [(r.provenance.group_id, r.score, r.rejected_score) for r in again]
    assert key != [(r.provenance.group_id, r.score, r.rejected_score) for r in other]


def test_dpo_all_equal_single_rollout_and_negative() -> None:
    rows, stats = dpo([group([1.0, 1.0, 1.0])], minimum_score_diff_max_min=0.0)
    assert rows == [] and stats.dropped == {"margin too small": 3}
    rows, stats = dpo([group([1.0])])
    assert rows == [] and stats.dropped == {"margin too small": 1}
    rows, stats = dpo([group([-0.1, -1.0])])
    assert rows == [] and stats.dropped == {"score <= 0": 2}
    rows, _ = dpo([group([-0.1, -1.0])], allow_negative_scores=True)
    assert [(r.score, r.rejected_score) for r in rows] == [(-0.1, -1.0)]
    assert rows[0].provenance.env == "arithmetic"


def test_tokens_only_group_needs_tokenizer() -> None:
    item = Item("f.jsonl", 3, ScoredGroup(scores=[1.0], tokens=[[1, 2, 3]], masks=[[-100, 2, 3]]))
    with pytest.raises(RecordError, match="no messages") as info:
        sft([item])
    assert "--tokenizer" in (info.value.hint or "")


def write_rows(tmp_path: Path, kind: str, fmt: str, rows: list, mode: str = "new", save_messages: bool = False):
    schema = schema_for(kind, fmt, save_messages)
    formatter = row_formatter(kind, fmt, save_messages)
    with DatasetWriter(tmp_path / "out", schema, mode) as writer:
        for row in rows:
            writer.write(formatter(row))
    return writer


@pytest.mark.parametrize(
    ("kind", "fmt", "columns"),
    [
        ("sft", "messages", ["messages"]),
        ("sft", "prompt-completion", ["prompt", "completion"]),
        ("dpo", "preference", ["prompt", "chosen", "rejected"]),
    ],
)
def test_trl_layout_loads_with_datasets(tmp_path: Path, kind: str, fmt: str, columns: list[str]) -> None:
    from datasets import load_dataset

    items = [group([1.0, 0.6, 0.0], gid=f"g{i}") for i in range(3)]
    rows = sft(items)[0] if kind == "sft" else dpo(items)[0]
    write_rows(tmp_path, kind, fmt, rows)
    lines = [json.loads(line) for line in (tmp_path / "out/train.jsonl").read_text().splitlines()]
    assert len(lines) == len(rows) > 0
    for path, builder in ((tmp_path / "out/train.parquet", "parquet"), (tmp_path / "out/train.jsonl", "json")):
        ds = load_dataset(builder, data_files=str(path), cache_dir=str(tmp_path / "cache"))["train"]
        assert ds.column_names[: len(columns)] == columns
        assert {"source", "env", "model", "group_id", "item_id", "score"} <= set(ds.column_names)
        first = ds[0]
        for column in columns:
            assert isinstance(first[column], list) and set(first[column][0]) == {"role", "content"}
        if kind == "dpo":
            assert first["chosen"][0]["role"] == "assistant" and first["prompt"][-1]["role"] == "user"
            assert first["margin"] == pytest.approx(first["score"] - first["rejected_score"])
        elif fmt == "messages":
            assert [m["role"] for m in first["messages"]] == ["system", "user", "assistant"]
    assert lines[0]["group_id"] == "g0" and lines[0]["source"] == "runs/a/groups.jsonl"


def test_atropos_legacy_records(tmp_path: Path) -> None:
    rows, _ = sft([group([1.0])])
    write_rows(tmp_path, "sft", "atropos", rows)
    line = json.loads((tmp_path / "out/train.jsonl").read_text())
    assert line["prefix"] == "Be brief.\n\nquestion g0" and line["completion"] == "answer 0" and line["score"] == 1.0
    rows, _ = dpo([group([1.0, 0.0])])
    write_rows(tmp_path / "d", "dpo", "atropos", rows, save_messages=True)
    line = json.loads((tmp_path / "d/out/train.jsonl").read_text())
    assert line["pos"][-1]["content"] == "answer 0" and line["neg"][-1]["content"] == "answer 1"


def test_writer_refuses_existing_then_appends_and_overwrites(tmp_path: Path) -> None:
    rows, _ = sft([group([1.0, 0.5])])
    write_rows(tmp_path, "sft", "messages", rows)
    with pytest.raises(OutputExistsError, match="already holds a dataset") as info:
        write_rows(tmp_path, "sft", "messages", rows)
    assert "--append-to-previous" in (info.value.hint or "")
    writer = write_rows(tmp_path, "sft", "messages", rows, mode="append")
    assert writer.total_rows == 4
    assert pq.read_metadata(tmp_path / "out/train.parquet").num_rows == 4
    assert len((tmp_path / "out/train.jsonl").read_text().splitlines()) == 4
    with pytest.raises(OutputExistsError, match="cannot append"):
        write_rows(tmp_path, "sft", "prompt-completion", rows, mode="append")
    write_rows(tmp_path, "sft", "messages", rows[:1], mode="overwrite")
    assert pq.read_metadata(tmp_path / "out/train.parquet").num_rows == 1
    assert not list((tmp_path / "out").glob("*.partial"))


def test_failed_write_keeps_previous_dataset(tmp_path: Path) -> None:
    rows, _ = sft([group([1.0, 0.5])])
    write_rows(tmp_path, "sft", "messages", rows)
    schema, formatter = schema_for("sft", "messages"), row_formatter("sft", "messages")
    with pytest.raises(KeyboardInterrupt), DatasetWriter(tmp_path / "out", schema, "overwrite") as writer:
        writer.write(formatter(rows[0]))
        raise KeyboardInterrupt
    assert pq.read_metadata(tmp_path / "out/train.parquet").num_rows == 2
    assert not list((tmp_path / "out").glob("*.partial"))


def test_card_lists_counts_filters_and_sources() -> None:
    _, stats = sft([group([1.0, 0.0])])
    card = render_card(
        kind="sft",
        fmt="messages",
        stats=stats,
        options={"save_top_n_per_group": 3},
        sources=["runs/a"],
        total_rows=1,
        columns=["messages"],
    )
    assert "| dropped: score <= 0 | 1 |" in card and "`runs/a`" in card and "`--save-top-n-per-group`: 3" in card
    assert 'load_dataset("parquet"' in card
    assert DropReason.DUPLICATE.value == "duplicate"


@pytest.mark.parametrize(("kind", "fmt"), [("sft", "messages"), ("sft", "prompt-completion"), ("dpo", "preference")])
def test_existing_keys_make_append_skip_rows_already_written(tmp_path: Path, kind: str, fmt: str) -> None:
    from atropos_cli.formats.dataset import existing_keys

    items = [group([1.0, 0.5, 0.0], gid=f"g{i}") for i in range(3)]
    rows = sft(items)[0] if kind == "sft" else dpo(items)[0]
    write_rows(tmp_path, kind, fmt, rows)
    seen = existing_keys(tmp_path / "out", kind, fmt)
    assert len(seen) == len(rows) > 0
    stats = DatagenStats()
    select = select_sft if kind == "sft" else select_dpo
    options = SftOptions() if kind == "sft" else DpoOptions()
    assert list(select(items, options, stats, seen=seen)) == []
    assert stats.dropped.get("duplicate") == len(rows)


def test_dpo_counts_each_rollout_once_by_role() -> None:
    # 1.0 is chosen; one of the three 0.0 rollouts is its rejected answer: it is used, not dropped.
    rows, stats = dpo([group([1.0, 0.0, 0.0, 0.0])])
    assert len(rows) == 1 and rows[0].rejected_score == 0.0
    assert stats.rejected_only == 1 and stats.dropped == {"score <= 0": 2}
    assert stats.breakdown("dpo") == [("used only as rejected", 1), ("in no pair: score <= 0", 2)]
    card = render_card(
        kind="dpo", fmt="prompt-chosen-rejected", stats=stats, options={}, sources=[], total_rows=1, columns=[]
    )
    assert "| chosen (one per pair) | 1 |" in card and "| used only as rejected | 1 |" in card
    assert "| in no pair: score <= 0 | 2 |" in card
