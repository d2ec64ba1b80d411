"""`atropos sft-gen` / `atropos dpo-gen` end to end: real rollout files, real output dirs, a real trajectory API."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from atropos_cli.cli.app import app
from atropos_cli.formats.jsonl import JsonlWriter
from atropos_cli.formats.parquet import write_parquet
from atropos_cli.types import GroupMeta, ScoredGroup

runner = CliRunner()


def make_groups(n: int = 12, size: int = 4) -> list[ScoredGroup]:
    groups = []
    for g in range(n):
        scores = [float((g + r) % 3) / 2 for r in range(size)]  # 0, 0.5, 1 in rotation: ties and zeros
        chats = [
            [
                {"role": "system", "content": "Answer with a number."},
                {"role": "user", "content": f"What is {g} + {g}?"},
                {"role": "assistant", "content": f"{2 * g + r % 2}"},
            ]
            for r in range(size)
        ]
        groups.append(
            ScoredGroup(
                scores=scores,
                messages=chats,
                tokens=[[1, 2, 3 + r] for r in range(size)],
                masks=[[-100, 2, 3 + r] for r in range(size)],
                meta=GroupMeta(group_id=f"g{g}", env="arithmetic", model="tiny", item_id=f"train-{g}"),
            )
        )
    return groups


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "runs" / "arith"
    groups = make_groups()
    with JsonlWriter(run / "groups.jsonl") as out:
        for group in groups:
            out.write(group)
    write_parquet(groups, run / "groups.parquet")
    return run


def invoke(*args: str) -> object:
    return runner.invoke(app, [str(a) for a in args])


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("command", ["sft-gen", "dpo-gen"])
def test_jsonl_and_parquet_inputs_give_identical_datasets(run_dir: Path, tmp_path: Path, command: str) -> None:
    a = invoke(command, run_dir / "groups.jsonl", "--out", tmp_path / "a")
    b = invoke(command, run_dir / "groups.parquet", "--out", tmp_path / "b")
    assert a.exit_code == 0, a.output
    assert b.exit_code == 0, b.output
    rows_a, rows_b = rows(tmp_path / "a/train.jsonl"), rows(tmp_path / "b/train.jsonl")
    assert rows_a and len(rows_a) == len(rows_b)
    for ra, rb in zip(rows_a, rows_b, strict=True):
        assert ra.pop("source").endswith("groups.jsonl") and rb.pop("source").endswith("groups.parquet")
        assert ra == rb
    assert (
        pq.read_table(tmp_path / "a/train.parquet")
        .drop(["source"])
        .equals(pq.read_table(tmp_path / "b/train.parquet").drop(["source"]))
    )
    assert "groups read" in a.output and "wrote" in a.output


def test_sft_gen_flags_summary_and_card(run_dir: Path, tmp_path: Path) -> None:
    result = invoke("sft-gen", str(run_dir), "--out", tmp_path / "sft", "--save-top-n-per-group", "1")
    assert result.exit_code == 0, result.output
    data = rows(tmp_path / "sft/train.jsonl")
    assert len(data) == 12  # every group has a score of 1.0 rollout
    assert all(r["score"] == 1.0 for r in data)
    assert "dropped: score <= 0" in result.output and "over the per-group limit" in result.output
    card = (tmp_path / "sft/README.md").read_text()
    assert "rows: 12" in card and "`--save-top-n-per-group`: 1" in card and str(run_dir) in card


def test_dpo_gen_is_deterministic_and_records_margin(run_dir: Path, tmp_path: Path) -> None:
    for name in ("d1", "d2"):
        result = invoke(
            "dpo-gen", run_dir, "--out", tmp_path / name, "--seed", "3", "--minimum-score-diff-max-min", "0.4"
        )
        assert result.exit_code == 0, result.output
    first, second = rows(tmp_path / "d1/train.jsonl"), rows(tmp_path / "d2/train.jsonl")
    assert first == second and first
    for row in first:
        assert set(row) >= {"prompt", "chosen", "rejected", "score", "rejected_score", "margin", "group_id"}
        assert row["margin"] > 0.4 and row["chosen"][0]["role"] == "assistant"


def test_refuses_existing_output_then_appends(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "sft"
    assert invoke("sft-gen", run_dir, "--out", out).exit_code == 0
    count = len(rows(out / "train.jsonl"))
    again = invoke("sft-gen", run_dir, "--out", out)
    assert again.exit_code == 2
    assert "already holds a dataset" in again.output and "--append-to-previous" in again.output
    # Dedupe (on by default) also covers the rows already in the dataset: appending the same run adds nothing.
    appended = invoke("sft-gen", run_dir, "--out", out, "--append-to-previous")
    assert appended.exit_code == 0, appended.output
    assert f"wrote 0 rows to {out} ({count} in the dataset)" in appended.output
    assert len(rows(out / "train.jsonl")) == pq.read_metadata(out / "train.parquet").num_rows == count
    appended = invoke("sft-gen", run_dir, "--out", out, "--append-to-previous", "--no-dedupe")
    assert appended.exit_code == 0, appended.output
    total = len(rows(out / "train.jsonl"))
    assert total > count and pq.read_metadata(out / "train.parquet").num_rows == total
    assert f"({total} in the dataset)" in appended.output
    both = invoke("sft-gen", run_dir, "--out", out, "--append-to-previous", "--overwrite")
    assert both.exit_code == 2 and "cannot be used together" in both.output
    bad = invoke("sft-gen", run_dir, "--out", tmp_path / "f", "--format", "chatml")
    flat = " ".join(bad.output.replace("│", " ").split())  # click's usage error comes in a wrapped box
    assert bad.exit_code == 2 and "'chatml' is not one of 'messages', 'prompt-completion', 'atropos'" in flat


def test_dry_run_writes_nothing_and_num_seqs_limits(run_dir: Path, tmp_path: Path) -> None:
    result = invoke("sft-gen", run_dir, "--out", tmp_path / "x", "--dry-run", "--num-seqs-to-save", "5")
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "x").exists()
    assert "dry run" in result.output and "rows selected" in result.output
    line = next(line for line in result.output.splitlines() if "rows selected" in line)
    assert line.split()[-1] == "5"


def test_corrupt_line_is_counted_or_fatal_with_strict(run_dir: Path, tmp_path: Path) -> None:
    path = run_dir / "groups.jsonl"
    lines = path.read_text().splitlines()
    lines.insert(3, '{"scores": [1.0], "messages": [[{"role": "user"')
    path.write_text("\n".join(lines) + "\n")
    result = invoke("sft-gen", path, "--out", tmp_path / "o")
    assert result.exit_code == 0, result.output
    assert f"{path}:4" in result.output
    assert "skipped: bad records" in result.output
    assert "bad records skipped: 1" in (tmp_path / "o/README.md").read_text()
    strict = invoke("sft-gen", path, "--out", tmp_path / "s", "--strict")
    assert strict.exit_code != 0
    assert f"{path}:4" in strict.output and not (tmp_path / "s/train.jsonl").exists()


def test_not_rollouts_and_missing_input(tmp_path: Path, run_dir: Path) -> None:
    assert invoke("sft-gen", run_dir, "--out", tmp_path / "sft").exit_code == 0
    result = invoke("sft-gen", tmp_path / "sft/train.jsonl", "--out", tmp_path / "again")
    assert result.exit_code != 0 and "holds no scored groups" in result.output
    result = invoke("dpo-gen", tmp_path / "nope.jsonl", "--out", tmp_path / "again")
    assert result.exit_code != 0 and "no such file" in result.output
    result = invoke("dpo-gen", "--out", tmp_path / "again")
    assert result.exit_code == 2 and "no input given" in result.output


def _tiny_tokenizer(directory: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<eos>", "user", ":", "What", "is", "2", "+", "?", "assistant", "4", "5"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>").save_pretrained(directory)
    return directory


def test_tokens_only_groups_need_and_use_a_tokenizer(tmp_path: Path) -> None:
    prompt = [2, 3, 4, 5, 6, 7, 6, 8, 9, 3]  # "user : What is 2 + 2 ? assistant :"
    groups = [
        ScoredGroup(
            scores=[1.0, 0.0],
            tokens=[prompt + [10, 1], prompt + [11, 1]],
            masks=[[-100] * 10 + [10, 1], [-100] * 10 + [11, 1]],
        )
    ]
    with JsonlWriter(tmp_path / "tok.jsonl") as out:
        out.write(groups[0])
    result = invoke("sft-gen", tmp_path / "tok.jsonl", "--out", tmp_path / "o")
    assert result.exit_code != 0
    assert "no messages" in result.output and "--tokenizer" in result.output
    tok = _tiny_tokenizer(tmp_path / "tok")
    result = invoke("sft-gen", tmp_path / "tok.jsonl", "--out", tmp_path / "o", "--tokenizer", tok)
    assert result.exit_code == 0, result.output
    (row,) = rows(tmp_path / "o/train.jsonl")
    assert row["messages"] == [
        {"role": "user", "content": "user : What is 2 + 2 ? assistant :"},
        {"role": "assistant", "content": "4"},
    ]
    result = invoke(
        "sft-gen", tmp_path / "tok.jsonl", "--out", tmp_path / "a", "--tokenizer", tok, "--format", "atropos"
    )
    assert result.exit_code == 0, result.output
    (row,) = rows(tmp_path / "a/train.jsonl")
    assert row["completion"] == "4 <eos>" and row["prefix"].startswith("user : What")


@pytest.fixture
def api(trajectory_api):
    return trajectory_api(disable_reset=True, api_key="sekret")


def _post_groups(api: Any, groups: list[ScoredGroup]) -> None:
    headers = {"Authorization": "Bearer sekret"}
    registration = {
        "wandb_group": "t", "wandb_project": "t", "batch_size": 8, "max_token_len": 64,
        "checkpoint_dir": "c", "save_checkpoint_interval": 0, "starting_step": 0, "num_steps": 10,
    }  # fmt: skip
    assert httpx.post(f"{api.url}/register", json=registration, headers=headers).status_code == 200
    response = httpx.post(f"{api.url}/scored_data_list", json=[g.to_scored_data() for g in groups], headers=headers)
    assert response.status_code == 200, response.text


def test_api_url_pulls_groups_without_reset(api: Any, tmp_path: Path) -> None:
    _post_groups(api, make_groups(n=4, size=4))
    args = ["sft-gen", "--api-url", api.url, "--api-key", "sekret", "--idle-timeout", "0.5", "--group-size", "4"]
    result = invoke(*args, "--tasks-per-step", "2", "--out", tmp_path / "o")
    assert result.exit_code == 0, result.output
    data = rows(tmp_path / "o/train.jsonl")
    assert {r["source"] for r in data} == {api.url}
    assert "groups read" in result.output and len(data) > 0
    # The API was never wiped: /reset_data is disabled there and answers 403, which --reset surfaces.
    result = invoke(*args, "--out", tmp_path / "r", "--reset")
    assert result.exit_code != 0 and "403" in result.output
    result = invoke("sft-gen", "--api-url", api.url, "--idle-timeout", "0.2", "--out", tmp_path / "k")
    assert result.exit_code != 0 and "--api-key" in result.output


def test_api_url_stops_at_num_seqs_without_waiting_for_idle(api: Any, tmp_path: Path) -> None:
    _post_groups(api, make_groups(n=4, size=4))
    # An idle timeout of a day: a reader that waited for it instead of stopping at --num-seqs-to-save would
    # never return, so the command returning at all is the check (the join's bound only guards against a hang).
    args = ["dpo-gen", "--api-url", api.url, "--api-key", "sekret", "--idle-timeout", "86400", "--group-size", "2"]
    results: list[Any] = []
    worker = threading.Thread(
        target=lambda: results.append(invoke(*args, "--num-seqs-to-save", "2", "--out", tmp_path / "o")), daemon=True
    )
    worker.start()
    worker.join(timeout=600)
    assert not worker.is_alive(), "dpo-gen kept reading after --num-seqs-to-save was reached"
    assert results[0].exit_code == 0, results[0].output
    assert len(rows(tmp_path / "o/train.jsonl")) == 2


def test_atropos_flat_messages_fall_back_to_tokens(tmp_path: Path) -> None:
    # Atropos' process-mode jsonl: one flat message per rollout (no assistant turn) plus token ids.
    prompt = [2, 3, 4, 5, 6, 7, 6, 8, 9, 3]
    record = {
        "scores": [1.0, 0.0],
        "tokens": [prompt + [10], prompt + [11]],
        "masks": [[-100] * 10 + [10], [-100] * 10 + [11]],
        "messages": [{"role": "user", "content": "What is 2 + 2 ?"}, {"role": "user", "content": "What is 2 + 2 ?"}],
    }
    (tmp_path / "atropos.jsonl").write_text(json.dumps(record) + "\n")
    result = invoke("sft-gen", tmp_path / "atropos.jsonl", "--out", tmp_path / "o", "--dry-run")
    assert result.exit_code == 0 and "unparseable" in result.output
    tok = _tiny_tokenizer(tmp_path / "tok")
    result = invoke("sft-gen", tmp_path / "atropos.jsonl", "--out", tmp_path / "o", "--tokenizer", tok)
    assert result.exit_code == 0, result.output
    (row,) = rows(tmp_path / "o/train.jsonl")
    assert row["messages"][-1] == {"role": "assistant", "content": "4"}
