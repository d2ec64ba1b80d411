"""`atropos train` on bad input as a user meets it: nothing dropped silently, one-line errors, strict flags."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from atropos_cli.cli.app import app
from atropos_cli.types import ScoredGroup
from tiny_models import save_tiny_arith_model

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A 2-layer model with a 290-token vocabulary and 256 positions."""
    pytest.importorskip("torch")
    return save_tiny_arith_model(tmp_path_factory.mktemp("m"), op="-", seed=1)


def _group(length: int = 8, seed: int = 0) -> dict:
    rng = random.Random(seed)
    tokens = [[rng.randrange(5, 280) for _ in range(length)] for _ in range(4)]
    masks = [[-100] * 4 + t[4:] for t in tokens]
    return ScoredGroup(tokens=tokens, masks=masks, scores=[1.0, 0.0, 0.0, 1.0]).to_record()


def _write(path: Path, records: list[dict | str]) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _train(tiny_model: Path, out: Path, *args: str):
    return runner.invoke(app, ["train", "--model", str(tiny_model), "--out", str(out), "--groups-per-step", "4", *args])


def test_corrupt_groups_are_counted_and_reported(tiny_model: Path, tmp_path: Path):
    mismatch = _group(seed=1)
    mismatch["masks"][0] = mismatch["masks"][0][:-1]
    wrong_count = _group(seed=2)
    wrong_count["scores"] = [1.0, 0.0]
    nan_score = json.dumps(_group(seed=3)).replace('"scores": [1.0', '"scores": [NaN')
    records = [_group(seed=s) for s in range(4, 8)] + ["{not json", mismatch, wrong_count, nan_score]
    data = _write(tmp_path / "r.jsonl", records)
    result = _train(tiny_model, tmp_path / "run", "--data", str(data), "--steps", "1")
    assert result.exit_code == 0, result.output
    assert "read 4 groups from --data (skipped 4 corrupt records)" in result.output
    for line in (5, 6, 7, 8):
        assert f"r.jsonl:{line}" in result.output, result.output
    assert "masks must align with tokens" in result.output and "finite" in result.output


@pytest.mark.parametrize("bad_id", [5000, -3])
def test_token_ids_outside_the_vocabulary_are_one_line_errors(tiny_model: Path, tmp_path: Path, bad_id: int):
    group = _group()
    group["tokens"][2][5] = bad_id
    data = _write(tmp_path / "r.jsonl", [_group(seed=9), group])
    result = _train(tiny_model, tmp_path / "run", "--data", str(data), "--steps", "1")
    assert result.exit_code == 2, result.output
    problem = "is negative" if bad_id < 0 else "is outside the trainer's vocabulary (0.."
    assert f"r.jsonl: group 1, rollout 2: token id {bad_id} {problem}" in result.output
    assert "Traceback" not in result.output and "IndexError" not in result.output
    assert result.output.count("error:") == 1 and "hint: train the model whose tokenizer" in result.output
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before the first step


def test_max_len_is_capped_at_the_model_positions_and_truncation_reported(tiny_model: Path, tmp_path: Path):
    data = _write(tmp_path / "r.jsonl", [_group(length=300, seed=s) for s in range(4)])
    result = _train(tiny_model, tmp_path / "run", "--data", str(data), "--steps", "1")
    assert result.exit_code == 0, result.output
    assert "max_len 2048 is over the model's 256 positions: using 256" in result.output
    assert "16 rollouts were longer than max_len 256 and were truncated" in result.output


def test_running_out_of_data_is_said(tiny_model: Path, tmp_path: Path):
    data = _write(tmp_path / "r.jsonl", [_group(seed=s) for s in range(4)])
    result = _train(tiny_model, tmp_path / "run", "--data", str(data), "--steps", "2")
    assert result.exit_code == 0, result.output
    assert "trained 1 steps" in result.output
    assert "the data ran out after 1 of 2 steps (4 groups, 4 per step, 1 epoch(s))" in result.output
    assert "raise --epochs" in result.output


def test_log_lines_show_loss_at_its_scale_and_the_gradient(tiny_model: Path, tmp_path: Path):
    data = _write(tmp_path / "r.jsonl", [_group(seed=s) for s in range(8)])
    result = _train(tiny_model, tmp_path / "run", "--data", str(data), "--steps", "2", "--lr", "1e-3")
    assert result.exit_code == 0, result.output
    steps = [line for line in result.output.splitlines() if line.startswith("step ")]
    assert len(steps) == 2 and all("|grad| " in line for line in steps)
    assert not any("loss +0.0000  clip 0.000" in line for line in steps)
    assert "(mean of the first 2 vs the last 2 steps)" in result.output


def test_unknown_flags_are_refused(tmp_path: Path):
    result = runner.invoke(app, ["train", "--tensor-parallel", "2", "--out", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert "no such option: --tensor-parallel" in " ".join(result.output.replace("│", " ").split())
    assert not (tmp_path / "run").exists()


def test_yaml_train_section_layers_under_the_flags(tiny_model: Path, tmp_path: Path):
    data = _write(tmp_path / "r.jsonl", [_group(seed=s) for s in range(4)])
    config = tmp_path / "c.yaml"
    config.write_text(f"train:\n  steps: 7\n  groups_per_step: 2\n  lr: 0.002\n  data: ['{data}']\n")
    result = _train(tiny_model, tmp_path / "run", "--config", str(config), "--steps", "1")
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "run" / "train_config.json").read_text())
    assert saved["grpo"]["steps"] == 1  # the flag beats the YAML
    assert saved["grpo"]["lr"] == 0.002  # the YAML beats the default
    assert saved["run"]["groups_per_step"] == 4  # the flag (given by _train) beats the YAML's 2
    typo = tmp_path / "typo.yaml"
    typo.write_text("train:\n  stepz: 3\n")
    bad = _train(tiny_model, tmp_path / "run2", "--config", str(typo))
    assert bad.exit_code == 2 and "unknown" in bad.output and "did you mean 'steps'?" in bad.output


def test_the_learning_rate_rule_is_stated_once():
    from atropos_cli.resources import DEFAULT_MODEL
    from atropos_cli.trainer.config import GRPOConfig

    assert GRPOConfig().lr == GRPOConfig(model=DEFAULT_MODEL).lr == 3e-4
    assert GRPOConfig(model="some/other-model").lr == 1e-5
    assert GRPOConfig(model=DEFAULT_MODEL, lr=0.01).lr == 0.01
