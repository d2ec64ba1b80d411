"""`atropos train` as users run it: exit codes, messages, files written."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from atropos_cli.cli.app import app
from atropos_cli.types import ScoredGroup
from tiny_models import save_tiny_arith_model

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    pytest.importorskip("torch")
    return save_tiny_arith_model(tmp_path_factory.mktemp("m"), op="-", seed=1)


def _rollouts(path: Path, n: int = 4) -> Path:
    rng = random.Random(0)
    with path.open("w") as f:
        for _ in range(n):
            tokens = [[rng.randrange(5, 280) for _ in range(8)] for _ in range(4)]
            masks = [[-100] * 4 + t[4:] for t in tokens]
            group = ScoredGroup(tokens=tokens, masks=masks, scores=[1.0, 0.0, 0.0, 1.0])
            f.write(json.dumps(group.to_record()) + "\n")
    return path


def assert_trained_copy(saved: Path, start: Path) -> None:
    """`saved` (a model.safetensors) holds every tensor of the model in `start`, same shapes, finite, and the
    training moved them (an empty, an untouched or a truncated save fails)."""
    from safetensors.torch import load_file

    before, after = load_file(str(start / "model.safetensors")), load_file(str(saved))
    assert set(after) >= set(before) and all(after[k].shape == before[k].shape for k in before)
    assert all(bool(after[k].isfinite().all()) for k in before)
    assert any(not bool((after[k].float() == before[k].float()).all()) for k in before), "no weight changed"


def test_help_does_not_import_torch():
    code = (
        "import sys; from atropos_cli.cli.app import app; app(['train', '--help'], standalone_mode=False); "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip().endswith("[]")
    assert "--loss" in result.stdout and "--inference" in result.stdout


def test_train_on_rollout_files_with_plot(tiny_model: Path, tmp_path: Path):
    data = _rollouts(tmp_path / "r.jsonl")
    out = tmp_path / "run"
    args = [
        "train",
        "--data",
        str(data),
        "--model",
        str(tiny_model),
        "--out",
        str(out),
        "--steps",
        "2",
        "--groups-per-step",
        "2",
        "--lr",
        "1e-3",
        "--loss",
        "dapo",
        "--plot",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "step    1/2  reward 0.500" in result.output
    assert "trained 2 steps; checkpoint" in result.output
    assert_trained_copy(out / "checkpoints" / "step-2" / "model.safetensors", tiny_model)
    assert (out / "reward_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((out / "train_config.json").read_text())["grpo"]["loss"] == "dapo"

    again = runner.invoke(app, args)
    assert again.exit_code == 2
    assert "is not empty" in again.output and "--resume" in again.output


def test_unknown_loss_is_refused_before_loading_anything(tmp_path: Path):
    result = runner.invoke(app, ["train", "--data", "x.jsonl", "--loss", "ppo9", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "unknown loss 'ppo9'" in result.output and "grpo, dapo, dr_grpo, gspo, cispo" in result.output


def test_bad_inference_and_missing_data(tmp_path: Path, tiny_model: Path):
    bad = runner.invoke(app, ["train", "--inference", "tgi", "--out", str(tmp_path / "a")])
    flat = " ".join(bad.output.replace("│", " ").split())  # click's usage error comes in a wrapped box
    assert bad.exit_code == 2 and "'tgi' is not one of 'local', 'vllm', 'vllm-colocate', 'external'" in flat
    missing = runner.invoke(
        app, ["train", "--data", str(tmp_path / "nope.jsonl"), "--model", str(tiny_model), "--out", str(tmp_path / "b")]
    )
    assert missing.exit_code != 0 and "nope.jsonl" in missing.output


def test_sft_mode_trains_and_saves_a_model(tiny_model: Path, tmp_path: Path):
    data = tmp_path / "sft.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": f"What is {a} - 1?"}, {"role": "assistant", "content": str(a - 1)}]}
        for a in range(8)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "sft"
    args = ["train", "--sft", str(data), "--model", str(tiny_model), "--out", str(out), "--steps", "2"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "saved the fine-tuned model to" in result.output
    assert_trained_copy(out / "model.safetensors", tiny_model)
    assert json.loads((out / "tokenizer.json").read_text()) == json.loads((tiny_model / "tokenizer.json").read_text())
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(out)  # the folder is a model transformers loads as it is
    assert reloaded.config.vocab_size == json.loads((tiny_model / "config.json").read_text())["vocab_size"]


def test_packed_training_from_files(tiny_model: Path, tmp_path: Path):
    data = _rollouts(tmp_path / "r.jsonl")
    args = ["train", "--data", str(data), "--model", str(tiny_model), "--steps", "1", "--groups-per-step", "4"]
    packed = runner.invoke(app, [*args, "--out", str(tmp_path / "p"), "--pack", "--micro-batch-tokens", "64"])
    assert packed.exit_code == 0, packed.output
    config = json.loads((tmp_path / "p" / "train_config.json").read_text())["grpo"]
    assert config["pack"] is True and config["micro_batch_tokens"] == 64
    metrics = json.loads((tmp_path / "p" / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["padded_tokens"] == 16 * 7  # 16 rollouts of 8 tokens (7 model positions each), no padding


def test_cuda_graphs_where_they_cannot_run_is_a_one_line_error(tiny_model: Path, tmp_path: Path):
    data = _rollouts(tmp_path / "r.jsonl")
    args = ["train", "--data", str(data), "--model", str(tiny_model), "--out", str(tmp_path / "o"), "--cuda-graphs"]
    result = runner.invoke(app, [*args, "--steps", "1"])
    assert result.exit_code == 2, result.output
    assert "--cuda-graphs needs a CUDA device" in result.output and "drop --cuda-graphs" in result.output
    assert "Traceback" not in result.output
