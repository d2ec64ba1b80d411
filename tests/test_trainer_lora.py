"""LoRA in the GRPO trainer (`--lora-r`), on the shipped model: only adapters train, the KL reference is the
base model with the adapter off, checkpoints hold the merged model + the adapter, --resume continues from the
adapter, the in-process engine gets the merged weights, and the CLI takes the flags and refuses bad ones."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import peft  # noqa: F401  (LoRA tests need peft)
import pytest
import torch
from typer.testing import CliRunner

from atropos_cli.cli.app import app
from atropos_cli.errors import ConfigError
from atropos_cli.resources import DEFAULT_MODEL, resolve_model_path
from atropos_cli.trainer.step.grpo import GRPOConfig, GRPOTrainer, _body_and_head
from atropos_cli.trainer.weights.lora import merged_state_dict, unwrap
from atropos_cli.trainer.weights.sync import LocalSync
from atropos_cli.types import ScoredGroup

runner = CliRunner()
BASE = Path(resolve_model_path(DEFAULT_MODEL))


def _groups(n: int, seed: int = 0) -> list[ScoredGroup]:
    rng = random.Random(seed)
    groups = []
    for _ in range(n):
        tokens = [[rng.randrange(5, 260) for _ in range(rng.randint(7, 10))] for _ in range(4)]
        masks = [[-100] * 3 + t[3:] for t in tokens]
        groups.append(ScoredGroup(tokens=tokens, masks=masks, scores=[1.0, 0.0, 1.0, 0.0]))
    return groups


def _config(out: Path | str = "unused", **kw) -> GRPOConfig:
    return GRPOConfig(**{"out": str(out), "lr": 1e-2, "lora_r": 4, "save_every": 0, "device": "cpu", **kw})


def _logits(model, ids: list[int]):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]


def _completion_logp(model, group: ScoredGroup) -> list[float]:
    """Mean log-prob of each rollout's trained tokens, from the full logits (independent of the trainer)."""
    out = []
    for ids, mask in zip(group.tokens, group.masks, strict=True):
        logp = torch.log_softmax(_logits(model, ids)[:-1].float(), -1)
        picked = logp.gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
        trained = torch.tensor([m != -100 for m in mask[1:]])
        out.append(float(picked[trained].mean()))
    return out


def _adapter(trainer: GRPOTrainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}


def test_a_step_trains_only_the_adapter_in_the_advantage_direction():
    trainer = GRPOTrainer(_config())
    assert trainer.is_lora
    base_before = {k: v.clone() for k, v in unwrap(trainer.model).state_dict().items() if ".lora_" not in k}
    trained = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trained and all(".lora_A." in n or ".lora_B." in n for n in trained)
    assert not any("lm_head" in n or "embed" in n for n in trained)  # all-linear leaves out the LM head
    groups = _groups(2)
    before = [_completion_logp(trainer.model, g) for g in groups]
    metrics = trainer.step(groups)
    assert metrics["grad_norm"] > 0
    base_after = {k: v for k, v in unwrap(trainer.model).state_dict().items() if ".lora_" not in k}
    assert base_after.keys() == base_before.keys()
    assert all(torch.equal(base_after[k], base_before[k]) for k in base_before)  # base bit-identical
    assert any(p.abs().sum() > 0 for n, p in _adapter(trainer).items() if "lora_B" in n)  # B moved off zero
    after = [_completion_logp(trainer.model, g) for g in groups]
    # scores [1, 0, 1, 0]: rewarded rollouts gain log-prob relative to the others
    moved = sum(
        (a - b) * (1 if score > 0 else -1)
        for group, old, new in zip(groups, before, after, strict=True)
        for score, b, a in zip(group.scores, old, new, strict=True)
    )
    assert moved > 0


def test_kl_reference_is_the_base_model_with_the_adapter_off():
    trainer = GRPOTrainer(_config(kl_beta=0.1))
    assert not isinstance(trainer.ref_model, torch.nn.Module)  # no second model was loaded
    first = trainer.step(_groups(2))
    assert abs(first["kl"]) < 1e-7  # lora_B starts at zero: policy == reference
    second = trainer.step(_groups(2, seed=1))
    assert second["kl"] > 1e-4  # the adapter moved the policy away from the reference
    # the reference still computes the untouched base model, while the policy differs from it
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(BASE)
    ids = torch.tensor([_groups(1, seed=5)[0].tokens[0]])
    body, head = _body_and_head(trainer.ref_model)
    with torch.no_grad():
        ref_logits = body(input_ids=ids).last_hidden_state @ head.T
    torch.testing.assert_close(ref_logits[0], _logits(base, ids[0].tolist()), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(_logits(trainer.model, ids[0].tolist()), ref_logits[0], atol=1e-3)


# peft 0.21 calls transformers 5's deprecated is_gradient_checkpointing when it builds a PeftModel
@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")
def test_checkpoint_is_a_merged_hf_model_plus_a_peft_adapter(tmp_path: Path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trainer = GRPOTrainer(_config(tmp_path))
    trainer.step(_groups(2))
    trainer.step(_groups(2, seed=1))
    checkpoint = trainer.save(tmp_path)
    assert checkpoint == tmp_path / "checkpoints" / "step-2"
    ids = _groups(1, seed=7)[0].tokens[0]
    expected = _logits(trainer.model, ids)

    merged = AutoModelForCausalLM.from_pretrained(checkpoint)  # a plain model: no peft needed to load it
    assert not any("lora" in k or "base_layer" in k for k in merged.state_dict())
    torch.testing.assert_close(_logits(merged, ids), expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(_logits(AutoModelForCausalLM.from_pretrained(BASE), ids), expected, atol=1e-3)
    assert AutoTokenizer.from_pretrained(checkpoint).chat_template

    adapter_dir = checkpoint / "adapter"
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8 and "q_proj" in config["target_modules"]
    assert (adapter_dir / "adapter_model.safetensors").is_file()
    assert not (adapter_dir / "model.safetensors").exists()
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(BASE), adapter_dir)
    torch.testing.assert_close(_logits(loaded, ids), expected, atol=1e-5, rtol=1e-5)

    only = trainer.save_adapter(tmp_path / "just-adapter")  # what the vLLM LoRA endpoint will be given
    assert sorted(p.name for p in only.iterdir() if p.suffix != ".md") == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]


def test_resume_reloads_adapter_optimizer_and_step_and_continues_exactly(tmp_path: Path):
    batches = [_groups(2, seed=s) for s in range(3)]
    straight = GRPOTrainer(_config(tmp_path / "a"))
    for groups in batches:
        straight.step(groups)

    first = GRPOTrainer(_config(tmp_path / "b"))
    for groups in batches[:2]:
        first.step(groups)
    first.save(tmp_path / "b")
    resumed = GRPOTrainer(_config(tmp_path / "b", seed=1))  # another seed: a different random lora_A init
    assert resumed.resume(tmp_path / "b") == tmp_path / "b" / "checkpoints" / "step-2"
    assert resumed.step_count == 2
    assert all(torch.equal(v, _adapter(first)[k]) for k, v in _adapter(resumed).items())
    resumed.step(batches[2])
    expected = _adapter(straight)
    assert all(torch.equal(value, expected[name]) for name, value in _adapter(resumed).items())  # bit-exact


def test_local_sync_gives_the_inference_model_the_merged_weights():
    from transformers import AutoModelForCausalLM

    trainer = GRPOTrainer(_config())
    trainer.step(_groups(2))
    engine_model = AutoModelForCausalLM.from_pretrained(BASE)
    metrics = LocalSync(SimpleNamespace(model=engine_model))(trainer)
    assert metrics["sync_s"] >= 0
    ids = _groups(1, seed=9)[0].tokens[0]
    torch.testing.assert_close(_logits(engine_model, ids), _logits(trainer.model, ids), atol=1e-5, rtol=1e-5)
    assert set(merged_state_dict(trainer.model)) >= set(engine_model.state_dict())


def test_gradient_checkpointing_with_lora_trains_the_same_adapter():
    plain = GRPOTrainer(_config())
    checkpointed = GRPOTrainer(_config(gradient_checkpointing=True))
    plain.step(_groups(2))
    checkpointed.step(_groups(2))
    expected = _adapter(plain)
    got = _adapter(checkpointed)
    assert any(v.abs().sum() > 0 for k, v in got.items() if "lora_B" in k)
    for name, value in got.items():
        torch.testing.assert_close(value, expected[name], atol=1e-6, rtol=1e-5)


def test_bf16_pure_casts_the_frozen_base_and_keeps_fp32_adapter_masters():
    trainer = GRPOTrainer(_config(dtype="bf16-pure"))
    assert {p.dtype for p in trainer.model.parameters()} == {torch.bfloat16}
    assert all(m.dtype == torch.float32 for m in trainer.precision.master)
    assert len(trainer.precision.master) == len(_adapter(trainer))  # masters for the adapter only
    trainer.step(_groups(2))
    assert any(m.abs().sum() > 0 for m in trainer.precision.master if m.shape[1] == 4)  # lora_B [out, r] moved
    # an fp32 engine gets bf16 base + update summed in fp32: not rounded back to the bf16 base weight
    from transformers import AutoModelForCausalLM

    engine = AutoModelForCausalLM.from_pretrained(BASE)
    LocalSync(SimpleNamespace(model=engine))(trainer)
    q_proj = unwrap(trainer.model).model.layers[0].self_attn.q_proj
    expected = q_proj.base_layer.weight.float() + q_proj.get_delta_weight("default").float()
    assert torch.equal(engine.model.layers[0].self_attn.q_proj.weight, expected)


def test_bad_lora_values_are_refused_with_a_hint():
    with pytest.raises(ConfigError, match="--lora-r must be >= 0, got -1") as info:
        GRPOTrainer(_config(lora_r=-1))
    assert "0 turns LoRA off" in info.value.hint
    with pytest.raises(ConfigError, match="unknown LoRA target module 'qkv'") as info:
        GRPOTrainer(_config(lora_target_modules="q_proj,qkv"))
    assert "q_proj" in info.value.hint and "up_proj" in info.value.hint
    with pytest.raises(ConfigError, match="'lm_head'"):
        GRPOTrainer(_config(lora_target_modules="lm_head"))
    with pytest.raises(ConfigError, match="no adapter"):
        GRPOTrainer(_config(lora_r=0)).save_adapter(Path("unused"))


def _cli_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(("error:", "hint:"))]


def test_cli_trains_arithmetic_with_lora_and_writes_the_checkpoint(tmp_path: Path):
    out = tmp_path / "run"
    args = ["train", "arithmetic", "--lora-r", "8", "--groups-per-step", "2", "--out", str(out), "--save-every", "0"]
    args += ["--env.group_size", "4", "--env.max_token_length", "8"]
    result = runner.invoke(app, [*args, "--steps", "2"])
    assert result.exit_code == 0, result.output
    assert "trained 2 steps; checkpoint" in result.output
    assert "LoRA r=8, alpha 16: training " in result.output
    checkpoint = out / "checkpoints" / "step-2"
    assert (checkpoint / "model.safetensors").is_file()
    assert (checkpoint / "adapter" / "adapter_model.safetensors").is_file()
    saved = json.loads((out / "train_config.json").read_text())["grpo"]
    assert (saved["lora_r"], saved["lora_alpha"], saved["lora_target_modules"]) == (8, None, "all-linear")

    resumed = runner.invoke(app, [*args, "--steps", "3", "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert "(step 2)" in resumed.output and "trained 3 steps" in resumed.output
    assert (out / "checkpoints" / "step-3" / "adapter" / "adapter_config.json").is_file()
    other_rank = runner.invoke(app, [*args, "--steps", "4", "--resume", "--lora-r", "16"])
    assert other_rank.exit_code == 2 and "grpo.lora_r" in other_rank.output


def test_cli_refuses_bad_lora_flags_in_one_line_with_a_hint(tmp_path: Path):
    bad_rank = runner.invoke(app, ["train", "--lora-r", "-1", "--out", str(tmp_path / "a")])
    assert bad_rank.exit_code == 2
    assert _cli_lines(bad_rank.output) == [
        "error: --lora-r must be >= 0, got -1",
        "hint: 0 turns LoRA off; 8, 16 or 64 are usual ranks",
    ]
    assert not (tmp_path / "a").exists()  # refused before anything was written

    data = tmp_path / "r.jsonl"
    data.write_text("".join(json.dumps(g.to_record()) + "\n" for g in _groups(2)))
    args = ["train", "--data", str(data), "--lora-r", "4", "--lora-target-modules", "qq_proj"]
    bad_target = runner.invoke(app, [*args, "--out", str(tmp_path / "b")])
    assert bad_target.exit_code == 2
    error, hint = _cli_lines(bad_target.output)
    assert error.startswith("error: unknown LoRA target module 'qq_proj'")
    assert hint.startswith("hint: 'all-linear' or a comma list of: ") and "v_proj" in hint

    sft = runner.invoke(app, ["train", "--sft", str(data), "--lora-r", "8", "--out", str(tmp_path / "c")])
    assert sft.exit_code == 2 and "--sft trains the full model" in sft.output
