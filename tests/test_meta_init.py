"""Meta-device construction and sharded materialisation (trainer/scale/meta_init.py, slices.py) on a CPU.

Two gloo ranks (subprocesses of this file, `worker`) build tiny models on the meta device, shard them with FSDP2
and fill only their own shards: from a saved checkpoint (a dense model with a tied LM head, and a Qwen3-MoE whose
checkpoint stores its experts one by one while the model holds them grouped) the logits must equal a normally
loaded model's; at random, the weights must be those one process draws; a LoRA GRPO step on the MoE (the
trainer's own many-rank path) trains adapters on the attention projections only and reports the router's
metrics; sharded with bf16 compute, frozen weights are bf16 shards, which the memory estimate counts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from atropos_cli.errors import ModelLoadError  # noqa: E402
from atropos_cli.testing import free_port  # noqa: E402

TOKENS = [[5, 17, 3, 99, 42, 7, 8, 120, 33, 2, 64, 11]]


def _save(name: str, directory: Path) -> None:
    """A tiny model of family `name` (random, seeded) with the shipped tokenizer, as save_pretrained writes it; an
    odd vocabulary, so the embedding's shards are uneven (144 and 143 rows)."""
    from atropos_cli.families import build
    from atropos_cli.resources import resolve_model_path

    model = build(name, vocab_size=287, tiny=True, seed=1)
    if name == "qwen3_moe":  # the router's aux loss joins the step's loss (router.py)
        model.config.output_router_logits = True
    model.generation_config.update(do_sample=True, temperature=0.7)  # carried on into checkpoints
    model.save_pretrained(directory)
    shipped = Path(resolve_model_path("atropos-tiny-arith"))
    for tokenizer_file in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy2(shipped / tokenizer_file, directory / tokenizer_file)


def _logits(model, ids):
    return model(input_ids=ids, use_cache=False).logits


def _from_checkpoint(directory: Path, dist) -> dict:
    """Max |logit difference| and |buffer difference| between the meta-built sharded model and a normal load."""
    from transformers import AutoModelForCausalLM

    from atropos_cli.trainer.scale import fsdp, meta_init

    normal = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    empty, _, source = meta_init.empty_policy(str(directory))
    assert meta_init.is_empty(empty)
    root = fsdp.shard(empty, _logits, dist.mesh, mixed=False)
    meta_init.materialise(root, "cpu", source, seed=0)
    assert not meta_init.is_empty(root)
    ids = torch.tensor(TOKENS)
    with torch.no_grad():
        diff = float((root(ids) - _logits(normal, ids)).abs().max())
    buffers = dict(normal.named_buffers())
    assert empty.generation_config.to_dict() == normal.generation_config.to_dict()
    return {
        "logits": diff,
        "buffers": max(float((b - buffers[n]).abs().max()) for n, b in empty.named_buffers()),
        "tied": empty.lm_head.weight is empty.model.embed_tokens.weight,
        "tied_expected": bool(normal.config.tie_word_embeddings),
    }


def _random_like_one_process(dist) -> float:
    """Max difference between random weights filled shard by shard on the ranks and drawn whole by one process
    (a dense model with a tied head, and the MoE's grouped experts)."""
    from atropos_cli.families import config_for
    from atropos_cli.trainer.scale import fsdp, meta_init

    worst = 0.0
    for family in ("qwen2", "qwen3_moe"):
        config = config_for(family, vocab_size=287, tiny=True)
        sharded = meta_init.empty_from_config(config)
        meta_init.materialise(fsdp.shard(sharded, _logits, dist.mesh, mixed=False), "cpu", None, seed=3)
        whole = meta_init.empty_from_config(config)
        meta_init.materialise(whole, "cpu", None, seed=3)
        assert (whole.lm_head.weight is whole.model.embed_tokens.weight) == config.tie_word_embeddings
        reference = whole.state_dict()
        gathered = dict(fsdp.full_weights(sharded))
        assert gathered.keys() <= reference.keys() and len(gathered) > 10
        assert all(t.abs().sum() > 0 for k, t in gathered.items() if k.endswith("proj") or "embed" in k)  # drawn
        worst = max(worst, *(float((t - reference[k]).abs().max()) for k, t in gathered.items()))
    return worst


def _lora_step(directory: Path, dist) -> dict:
    """One LoRA GRPO step of the trainer's many-rank path (meta-built, sharded, filled from the checkpoint)."""
    from atropos_cli.trainer.config import GRPOConfig
    from atropos_cli.trainer.step.grpo import GRPOTrainer
    from atropos_cli.types import ScoredGroup

    config = GRPOConfig(model=str(directory), out=tempfile.mkdtemp(prefix="meta-lora-"), device="cpu", lr=1e-3,
                        max_len=64, lora_r=4)  # fmt: skip
    trainer = GRPOTrainer(config, dist=dist)
    trained = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    groups = [
        ScoredGroup(tokens=[t[: 8 + i] for i in range(4) for t in TOKENS], masks=[[-100] * 3 + t[3 : 8 + i]
                    for i in range(4) for t in TOKENS], scores=[1.0, 0.0, 0.5, 0.25])
        for _ in range(2)
    ]  # fmt: skip
    assert trainer.router is not None and trainer.router.coef > 0  # the aux loss is in the loss, not only metrics
    metrics = trainer.step(groups)
    return {
        "trained": sorted({n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trained}),
        "moe": {k: v for k, v in metrics.items() if k.startswith("moe_")},
        "loss": metrics["loss"],
    }


def _bf16_frozen_shards(dist) -> dict:
    """Sharded for bf16 compute, a LoRA MoE keeps bf16 shards of its frozen weights: their bytes, against the
    estimate (replicate.state_bytes without the gathered weights and the gradient)."""
    from atropos_cli.families import config_for
    from atropos_cli.trainer.scale import fsdp, meta_init
    from atropos_cli.trainer.scale.replicate import state_bytes
    from atropos_cli.trainer.weights import lora

    model = lora.wrap(meta_init.empty_from_config(config_for("qwen3_moe", vocab_size=287, tiny=True)), 4, None,
                      0.0, "all-linear")  # fmt: skip
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    root = fsdp.shard(model, _logits, dist.mesh, mixed=True)
    meta_init.materialise(root, "cpu", None, seed=0)
    local = [meta_init._local(p) for p in root.parameters()]
    dtypes = {str(p.dtype): p.requires_grad for p in root.parameters()}
    mine = sum(t.numel() * t.element_size() for t in local)
    mine += 8 * sum(meta_init._local(p).numel() for p in root.parameters() if p.requires_grad)  # AdamW's moments
    estimate = state_bytes(total, trainable, "fsdp", dist.world, "micro-batch", gathered=0, frozen_bytes=2)
    return {"bytes": sum(dist.gather(mine)), "estimate": estimate * dist.world - 4 * trainable, "dtypes": dtypes}


def worker(out: str) -> None:
    from atropos_cli.trainer.scale.distributed import init_from_env

    dist = init_from_env("cpu", 120)
    result = {
        "dense": _from_checkpoint(Path(out, "dense"), dist),
        "moe": _from_checkpoint(Path(out, "moe"), dist),
        "random": _random_like_one_process(dist),
        "lora": _lora_step(Path(out, "moe"), dist),
        "bf16": _bf16_frozen_shards(dist),
    }
    Path(out, f"rank{dist.rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.close()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("meta")
    _save("qwen2", out / "dense")  # tied LM head
    _save("qwen3_moe", out / "moe")  # experts stored one by one
    port, procs = free_port(), []
    for rank in range(2):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # fmt: skip
        command = [sys.executable, __file__, str(out)]
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    for proc in procs:
        stdout, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, stdout.decode()[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("name", ["dense", "moe"])
def test_a_meta_built_sharded_model_computes_the_checkpoints_logits(ranks: list[dict], name: str):
    for result in ranks:
        found = result[name]
        assert found["logits"] < 1e-5 and found["buffers"] == 0.0  # RoPE's inv_freq computed, not left empty
        assert found["tied"] == found["tied_expected"]
    assert ranks[0]["dense"]["tied_expected"]  # the dense case does test a tied head


def test_random_weights_do_not_depend_on_the_number_of_ranks(ranks: list[dict]):
    assert all(result["random"] == 0.0 for result in ranks)


def test_lora_on_a_sharded_moe_adapts_attention_and_reports_the_router(ranks: list[dict]):
    lora = ranks[0]["lora"]
    assert lora["trained"] == ["k_proj", "o_proj", "q_proj", "v_proj"]  # no adapter on experts or router
    assert set(lora["moe"]) == {"moe_aux_loss", "moe_load_max", "moe_load_min"}
    assert lora["moe"]["moe_load_max"] >= 1.0 >= lora["moe"]["moe_load_min"] >= 0.0
    assert lora["loss"] == lora["loss"] and ranks[1]["lora"]["moe"] == lora["moe"]  # finite, the same on both


def test_frozen_weights_shard_in_bf16_as_the_estimate_counts(ranks: list[dict]):
    bf16 = ranks[0]["bf16"]
    assert bf16["dtypes"] == {"torch.bfloat16": False, "torch.float32": True}  # frozen bf16, adapters fp32
    assert bf16["bytes"] == bf16["estimate"]


def test_experts_stored_one_by_one_are_read_as_each_ranks_group(tmp_path: Path):
    from safetensors.torch import save_file

    from atropos_cli.trainer.scale.slices import CheckpointSlices

    experts = {f"m.experts.{e}.{p}.weight": torch.full((2, 3), float(10 * e + i))
               for e in range(4) for i, p in enumerate(("gate_proj", "up_proj", "down_proj"))}  # fmt: skip
    save_file({**experts, "m.norm.weight": torch.arange(4.0)}, str(tmp_path / "model.safetensors"))
    reader = CheckpointSlices(tmp_path)
    gate_up = reader.rows("m.experts.gate_up_proj", 1, 3)  # experts 1 and 2: gate rows then up rows
    assert gate_up.shape == (2, 4, 3) and gate_up[0, :2].eq(10).all() and gate_up[1, 2:].eq(21).all()
    assert reader.rows("m.experts.down_proj", 3, 4)[0].eq(32).all()
    assert reader.rows("m.norm.weight", 2, 4).tolist() == [2.0, 3.0]
    with pytest.raises(ModelLoadError, match="no tensor 'm.experts.gate_up_proj_blocks'") as err:
        reader.rows("m.experts.gate_up_proj_blocks", 0, 1)  # a quantized checkpoint's name
    assert "bf16" in (err.value.hint or "")
    with pytest.raises(ModelLoadError, match="no safetensors"):
        CheckpointSlices(tmp_path / "nothing")


def test_moe_and_eager_attention_activations_shrink_the_default_micro_batch():
    from atropos_cli.families import config_for
    from atropos_cli.trainer.config import activation_bytes_per_token, default_micro_batch_tokens

    gpu, state = 80 * 2**30, 16 * 10**9  # gpt-oss-20b LoRA on 4 GPUs: bf16 frozen shards + gathered weights
    config = config_for("gpt-oss-20b")
    dense_rule = 48 * config.num_hidden_layers * config.hidden_size
    moe = activation_bytes_per_token(config, False)
    eager = activation_bytes_per_token(config, False, eager_len=1025)  # padded rows, eager attention (sinks)
    assert dense_rule < moe < eager
    assert default_micro_batch_tokens("cuda:0", True, gpu, state, moe) == 8192
    assert default_micro_batch_tokens("cuda:0", True, gpu, state, eager) == 4096  # the probabilities are counted


if __name__ == "__main__":
    worker(sys.argv[1])
