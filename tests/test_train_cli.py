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
    # the path, said before the first step (no rollouts line: the groups come from files)
    assert "attention: llama, causal" in packed.output and "rollouts:" not in packed.output
    said = packed.output.index("training: packed rows (varlen attention's dense path); one process; CUDA graphs: off")
    assert said < packed.output.index("step    1/1")
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


@pytest.mark.parametrize(
    "spec", ["arithmetic", "vf:vf_arithmetic", "gym:games:GuessNumber-v0", "openenv:http://127.0.0.1:8000", "a b.py:E"]
)
def test_run_directory_names_are_file_safe_and_the_same_in_train_and_process(spec: str, tmp_path: Path):
    from atropos_cli.cli.train import default_train_out
    from atropos_cli.runs.process import default_out_dir

    trained, processed = default_train_out(spec), default_out_dir(spec, base=tmp_path)
    assert trained.parent == Path("runs") and trained.name == f"train-{processed.name}"
    assert all(c.isalnum() or c in "-_." for c in trained.name), trained.name


def test_a_failed_start_leaves_out_reusable(tiny_model: Path, tmp_path: Path):
    data, out = _rollouts(tmp_path / "r.jsonl"), tmp_path / "run"
    args = ["train", "--data", str(data), "--out", str(out), "--steps", "1", "--groups-per-step", "2"]
    failed = runner.invoke(app, [*args, "--model", str(tmp_path / "no-such-model")])
    assert failed.exit_code == 2 and "error:" in failed.output
    (out / "vllm.log").write_text("what a failed engine said\n")  # logs stay: an error's hint may name them
    assert sorted(p.name for p in out.iterdir()) == ["vllm.log"]
    retry = runner.invoke(app, [*args, "--model", str(tiny_model)])
    assert retry.exit_code == 0, retry.output
    assert (out / "checkpoints" / "step-1").is_dir() and (out / "vllm.log").is_file()


FINITE_ENV = '''
from atropos_cli.env.base import SimpleEnv


class ThreeItems(SimpleEnv):
    """Three items, then none: a taskset smaller than the run. Reward: an even-length reply (signal at random)."""

    name = "three_items"

    def items(self, split):
        return [{"id": i, "q": str(i)} for i in range(3)]

    def prompt(self, item):
        return "Say " + item["q"]

    def reward(self, completion, item):
        return float(len(completion) % 2 == 0)
'''


@pytest.mark.parametrize("mode", ["stop", "cycle"])
def test_an_env_that_runs_out_of_items_says_so_and_stops_or_cycles(mode: str, tiny_model: Path, tmp_path: Path):
    env = tmp_path / "three_items.py"
    env.write_text(FINITE_ENV)
    args = ["train", str(env), "--model", str(tiny_model), "--out", str(tmp_path / mode), "--steps", "5"]
    args += ["--groups-per-step", "1", "--env.group_size", "6", "--env.max_token_length", "8", "--lr", "3e-2"]
    result = runner.invoke(app, [*args, *(["--on-exhausted", "stop"] if mode == "stop" else [])])
    assert result.exit_code == 0, result.output
    if mode == "stop":
        trained = int(result.output.split("trained ")[1].split(" steps")[0])
        assert trained <= 3
        assert f"warning: the env ran out of items after {trained} of 5 steps (its 3 items)" in result.output
        assert "hint: pass --on-exhausted cycle to start its items over" in result.output
    else:
        assert "the env's 3 items ran out: starting epoch 2" in result.output
        assert "trained 5 steps" in result.output and "epochs over the env's 3 items" in result.output
        assert "warning" not in result.output


def test_train_prints_elapsed_and_eta_and_evaluates_every_n_steps(tiny_model: Path, tmp_path: Path):
    env, out = tmp_path / "three_items.py", tmp_path / "run"
    env.write_text(FINITE_ENV)
    args = ["train", str(env), "--model", str(tiny_model), "--out", str(out), "--steps", "2", "--groups-per-step", "1"]
    args += ["--env.group_size", "4", "--env.max_token_length", "8", "--lr", "3e-2", "--eval-every", "1"]
    result = runner.invoke(app, [*args, "--eval-items", "2"])
    assert result.exit_code == 0, result.output
    steps = [line for line in result.output.splitlines() if line.startswith("step ")]
    assert steps and all(" elapsed, ETA " in line for line in steps), result.output
    evals = [line for line in result.output.splitlines() if line.startswith("eval at step ")]
    assert [line.split(":")[0] for line in evals] == ["eval at step 1", "eval at step 2"], result.output
    assert all("pass@1 " in line and ", 2 items, 0 failed samples" in line for line in evals), evals
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["eval_num_items"] for m in logged if "eval_num_items" in m] == [2, 2]
    assert all(0.0 <= m["eval_pass@1"] <= 1.0 for m in logged if "eval_pass@1" in m)


def test_eval_every_needs_an_env_run(tmp_path: Path):
    data = _rollouts(tmp_path / "r.jsonl")
    result = runner.invoke(app, ["train", "--data", str(data), "--eval-every", "5", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert result.output.startswith("error: --eval-every evaluates the env of a one-process run")
    assert not (tmp_path / "o").exists()
