"""`--inference vllm-colocate` without vLLM: its flags, the fail-fast error, the probe comparison and the trainer's
side of the probe. The engine itself is tested with real vLLM in tests/test_vllm_colocate.py (opt-in)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from atropos_cli.cli.app import app
from atropos_cli.trainer.weights.vllm_colocate import (
    PROBE_TEXT,
    WeightSyncError,
    check_probe,
    default_tolerance,
    trainer_logprobs,
    trainer_weights,
)
from atropos_cli.types import ScoredGroup

runner = CliRunner()
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def _flat(output: str) -> str:
    return " ".join(output.replace("│", " ").split())  # click's usage errors come in a wrapped box


@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed here")
def test_without_vllm_the_run_stops_at_once_with_a_hint(tmp_path: Path):
    result = runner.invoke(app, ["train", "arithmetic", "--inference", "vllm-colocate", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("error: --inference vllm-colocate needs vLLM in this Python (") and len(lines) == 2
    assert lines[1] == "hint: pip install vllm (or run vLLM from its own venv: --inference vllm --vllm-python PATH)"
    assert not (tmp_path / "o").exists()  # nothing written, no model loaded


def test_the_flags_reach_the_run_options(tmp_path: Path):
    """--data trains without an engine, so the options are only recorded: train_config.json shows them."""
    from tiny_models import save_tiny_arith_model

    model = save_tiny_arith_model(tmp_path / "m", op="-", seed=1)
    tokens = [[5, 6, 7, 8, 9, 10 + i] for i in range(2)]
    group = ScoredGroup(tokens=tokens, masks=[[-100, -100, *t[2:]] for t in tokens], scores=[1.0, 0.0])
    data = tmp_path / "r.jsonl"
    data.write_text(json.dumps(group.to_record()) + "\n")
    flags = ["--vllm-gpu-memory-utilization", "0.45", "--vllm-sleep-mode", "--vllm-probe-tolerance", "0.02"]
    args = ["train", "--data", str(data), "--model", str(model), "--out", str(tmp_path / "run"), "--steps", "1"]
    result = runner.invoke(app, [*args, "--inference", "vllm-colocate", *flags])
    assert result.exit_code == 0, result.output
    run = json.loads((tmp_path / "run" / "train_config.json").read_text())["run"]
    assert run["inference"] == "vllm-colocate" and run["vllm_gpu_memory_utilization"] == 0.45
    assert run["vllm_sleep_mode"] is True and run["vllm_probe_tolerance"] == 0.02
    bad = runner.invoke(app, [*args, "--vllm-gpu-memory-utilization", "1.5"])
    assert bad.exit_code == 2 and "vllm_gpu_memory_utilization" in _flat(bad.output)


def test_the_probe_passes_within_tolerance_and_reports_the_gaps():
    gap = check_probe([-1.0, -2.0, -0.5], [-1.0005, -2.0, -0.4995], tolerance=1e-3, step=3)
    assert gap.max == pytest.approx(5e-4) and gap.mean == pytest.approx(1e-3 / 3)
    assert default_tolerance("float32") == 1e-3 and default_tolerance("bfloat16") == 0.2


def test_a_desynced_probe_is_an_error_naming_the_gaps():
    with pytest.raises(WeightSyncError) as caught:
        check_probe([-1.0, -2.0, -0.5, -3.0], [-1.0, -2.0, -0.5, -1.0], tolerance=1e-3, step=7)
    error = caught.value
    assert error.message.startswith("weight sync check failed at step 7:")
    assert "by 0.5 on average, 2 at most (tolerance 0.001 on the average)" in error.message
    assert "--vllm-probe-tolerance" in (error.hint or "")
    # one token far off within a small average passes: bf16 rounding moves single tokens, a desync moves all
    assert check_probe([-1.0] * 99 + [-1.5], [-1.0] * 100, tolerance=0.01, step=1).max == 0.5


@pytest.mark.parametrize(
    ("engine", "trainer", "needle"),
    [([-1.0, math.nan], [-1.0, -1.0], "nan on average"), ([-1.0], [-1.0, -2.0], "vLLM scored 1 probe tokens")],
)
def test_nan_or_a_different_length_never_passes(engine: list[float], trainer: list[float], needle: str):
    with pytest.raises(WeightSyncError, match=needle):
        check_probe(engine, trainer, tolerance=1.0, step=2)


@pytest.fixture(scope="module")
def tiny_trainer(tmp_path_factory: pytest.TempPathFactory):
    from atropos_cli.trainer.step.grpo import GRPOConfig, GRPOTrainer

    return GRPOTrainer(GRPOConfig(out=str(tmp_path_factory.mktemp("t")), device="cpu", max_len=256))


def test_the_trainers_probe_logprobs_are_a_plain_forwards(tiny_trainer):
    """The trainer's side of the probe (the loss's own code path) equals a plain transformers forward."""
    import torch

    ids = list(tiny_trainer.tokenizer.encode(PROBE_TEXT))
    ours = trainer_logprobs(tiny_trainer, ids)
    with torch.no_grad():
        logits = tiny_trainer.model(torch.tensor([ids])).logits[0].float()
    plain = torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].tolist()
    assert len(ours) == len(ids) - 1 and max(abs(a - b) for a, b in zip(ours, plain, strict=True)) < 1e-4
    assert tiny_trainer.model.training  # the probe switched dropout off only for itself


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # peft 0.21.2
def test_a_lora_run_hands_over_merged_weights_under_the_plain_names(tmp_path: Path, tiny_trainer):
    import torch

    from atropos_cli.trainer.step.grpo import GRPOConfig, GRPOTrainer

    lora = GRPOTrainer(GRPOConfig(out=str(tmp_path), device="cpu", max_len=256, lora_r=4))
    with torch.no_grad():  # a non-zero adapter, so merged != base
        for name, p in lora.model.named_parameters():
            if "lora_B" in name:
                p.fill_(0.01)
    merged = dict(trainer_weights(lora))
    plain = tiny_trainer.model.state_dict()
    assert set(merged) == set(plain)
    changed = [k for k in plain if not torch.equal(merged[k], plain[k])]
    assert all(t.dtype == torch.float32 for t in merged.values())
    assert changed and all(k.endswith("proj.weight") for k in changed)


@pytest.mark.parametrize(
    ("device", "world", "needle"),
    [("cuda:1", "1", "CUDA_VISIBLE_DEVICES=1 and --device cuda"), ("cpu", "2", "--inference external")],
)
def test_one_process_on_one_device_is_checked_before_vllm_starts(
    device: str, world: str, needle: str, monkeypatch: pytest.MonkeyPatch
):
    from types import SimpleNamespace

    from atropos_cli.errors import ConfigError
    from atropos_cli.trainer.config import RunOptions
    from atropos_cli.trainer.weights.vllm_colocate import start_colocated

    monkeypatch.setenv("WORLD_SIZE", world)
    with pytest.raises(ConfigError) as caught:
        start_colocated(SimpleNamespace(device=device), RunOptions(inference="vllm-colocate"))
    assert needle in (caught.value.hint or "")
