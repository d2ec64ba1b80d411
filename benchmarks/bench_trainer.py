"""GRPO optimizer steps: our trainer vs Atropos' example_trainer, same model, same batch, same card, same run.

What it measures, per variant: tokens/s over timed steps (after warm-up), MFU, peak GPU memory, and the
relative error of the policy-gradient (all parameters) against an fp32 reference (fp32 weights, fp32 logits,
TF32 off). The model is Qwen2.5-0.5B-shaped with random weights built from a config (no download); a step is
64 sequences x 1024 tokens (256 prompt tokens masked, 768 completion tokens trained), groups of 8.

    python benchmarks/bench_trainer.py                 # GPU, the full comparison (needs atroposlib's
                                                       # example_trainer importable for the Atropos rows)
    python benchmarks/bench_trainer.py --tiny --device cpu --steps 1   # a smoke test of the script itself

For the Atropos rows, atroposlib==0.4.0's wheel (it holds `example_trainer`) and its import-time needs that the
machine lacks (tenacity, requests, wandb and their pure-Python dependencies) are installed with
`pip install --no-deps --target /tmp/site`; the script appends /tmp/site to sys.path (the machine's own packages
win). The recorded run is benchmarks/results/trainer_gpu.md.

MFU counts model FLOPs only (6 x matmul params + 12 x layers x hidden x seq per token, PaLM's formula), never
recomputation, against 989 TFLOP/s (H100/H200 dense bf16).
"""

from __future__ import annotations

import argparse
import copy
import gc
import math
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
CARRIED = "/tmp/site"  # wheels carried to the GPU machine; appended, so the machine's own packages win
if Path(CARRIED).is_dir():
    sys.path.append(CARRIED)
PEAK_FLOPS = 989.4e12


def qwen_config(tiny: bool):
    from transformers import Qwen2Config

    if tiny:
        return Qwen2Config(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=2048,
            tie_word_embeddings=True,
        )
    return Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    )


def flops_per_token(model, seq_len: int) -> float:
    cfg = model.config
    skip = ("embed_tokens", "lm_head")
    matmul = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and n.split(".")[-2] not in skip)
    matmul += cfg.vocab_size * cfg.hidden_size  # the LM head (tied or not) is one matmul
    return 6 * matmul + 12 * cfg.num_hidden_layers * cfg.hidden_size * seq_len


def make_groups(n_seqs: int, seq_len: int, group_size: int, vocab: int, seed: int):
    from atropos_cli.types import ScoredGroup

    gen = torch.Generator().manual_seed(seed)
    prompt = seq_len // 4
    groups = []
    for _ in range(n_seqs // group_size):
        tokens = torch.randint(0, vocab, (group_size, seq_len), generator=gen).tolist()
        masks = [[-100] * prompt + t[prompt:] for t in tokens]
        inf = (-torch.rand(group_size, seq_len, generator=gen) * 12).tolist()
        inf = [[1.0] * prompt + row[prompt:] for row in inf]
        scores = torch.randint(0, 2, (group_size,), generator=gen).float().tolist()
        scores[0], scores[1] = 1.0, 0.0  # every group has signal
        groups.append(ScoredGroup(tokens=tokens, masks=masks, scores=scores, inference_logprobs=inf))
    return groups


def fresh_model(cfg, device, dtype=torch.float32, state=None):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa").to(device)
    if state is not None:
        model.load_state_dict(state)
    return model


def _sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _reset(device):
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak(device) -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else float("nan")


def time_steps(step, steps: int, warmup: int, device: str) -> float:
    for _ in range(warmup):
        step()
    _sync(device)
    started = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    return (time.perf_counter() - started) / steps


def bench_ours(args, cfg, state, groups, variant: dict):
    from atropos_cli.trainer.grpo import GRPOConfig, GRPOTrainer

    _reset(args.device)
    model = fresh_model(cfg, args.device, state=state)
    config = GRPOConfig(
        out="/tmp/bench",
        dtype=variant["dtype"],
        device=args.device,
        micro_batch_tokens=variant["micro"],
        gradient_checkpointing=variant["ckpt"],
        compile=variant["compile"],
        pack=variant["pack"],
        activation_memory_budget=variant["budget"],
        lr=1e-6,
        max_len=args.seq_len + 1,
    )
    trainer = GRPOTrainer(config, model=model)
    per_step = time_steps(lambda: trainer.step(groups), args.steps, args.warmup, args.device)
    peak = _peak(args.device)
    return per_step, peak


def parse_variant(spec: str) -> dict:
    """micro_tokens:checkpointing:compile:dtype[:pack[:activation_budget]], e.g. 8192:0:1:bf16-pure:1:0.5"""
    parts = spec.split(":")
    return {
        "micro": int(parts[0]),
        "ckpt": bool(int(parts[1])),
        "compile": bool(int(parts[2])),
        "dtype": parts[3],
        "pack": bool(int(parts[4])) if len(parts) > 4 else False,
        "budget": float(parts[5]) if len(parts) > 5 else None,
    }


def describe(v: dict) -> str:
    text = f"{v['dtype']}, micro-batch {v['micro']} tokens, ckpt {'on' if v['ckpt'] else 'off'}"
    text += ", compiled" if v["compile"] else ""
    text += ", packed" if v["pack"] else ""
    text += f", activation budget {v['budget']}" if v["budget"] is not None else ""
    return text


def load_example_trainer():
    """Import Atropos' example_trainer unmodified; its wandb import gets a stub only if wandb is missing."""
    note = ""
    try:
        import wandb  # noqa: F401
    except Exception as exc:  # missing, or its carried dependencies clash with the machine's
        import types

        sys.modules["wandb"] = types.ModuleType("wandb")
        note = f"wandb stubbed ({exc}); it is not called in a step"
    from example_trainer import data, model, trainers, training
    from example_trainer.config import TrainingConfig

    return data, model, trainers, training, TrainingConfig, note


def bench_atropos(args, cfg, state, groups, micro: int, ckpt: bool, mods):
    data_mod, model_mod, trainers_mod, training_mod, TrainingConfig, _ = mods
    _reset(args.device)
    model = model_mod._load_model_with_attention(cfg, from_config=True)  # bf16 weights, as Atropos loads them
    model.load_state_dict({k: v.to(torch.bfloat16) for k, v in state.items()})
    model = model.to(args.device)
    n = sum(g.size for g in groups)
    config = TrainingConfig(
        model_name="bench",
        batch_size=micro,
        gradient_accumulation_steps=n // micro,
        device=args.device,
        seq_len=args.seq_len,
    )
    if ckpt:
        model_mod._setup_gradient_checkpointing(model, config)
    model.train()
    optimizer = trainers_mod.create_optimizer(model, config)
    counter = [0]
    # pad_data_to_good_offset mutates the dicts it gets (as fresh JSON from the API); give each step its own
    # copy, made before the clock starts
    copies = [{"batch": copy.deepcopy([g.to_scored_data() for g in groups])} for _ in range(args.steps + args.warmup)]

    def step():
        batch = copies.pop()
        tokens, labels, adv, temps, inf = data_mod.pad_data_to_good_offset(batch, micro)
        training_mod.run_training_step(model, optimizer, tokens, labels, adv, temps, config, counter[0], inf)
        counter[0] += 1

    per_step = time_steps(step, args.steps, args.warmup, args.device)
    peak = _peak(args.device)
    return per_step, peak


def _flat_grad(model) -> torch.Tensor:
    return torch.cat([p.grad.detach().float().flatten() for p in model.parameters() if p.grad is not None])


def grad_errors(args, cfg, state, groups, mods):
    """Relative L2 error of each path's gradient vs an fp32 reference, on the first group (8 sequences)."""
    from atropos_cli.trainer.batching import micro_batches, prepare
    from atropos_cli.trainer.grpo import GRPOConfig, GRPOTrainer
    from atropos_cli.trainer.logprobs import naive_token_logprobs

    torch.backends.cuda.matmul.allow_tf32 = False
    _reset(args.device)
    one = groups[:1]
    prepared = prepare(one, scale_rewards=True, dynamic_sampling=False, max_len=args.seq_len + 1)
    (mb,) = micro_batches(prepared.samples, 10**9)
    mb = mb.to(args.device)
    ref_model = fresh_model(cfg, args.device, state=state)
    hidden = ref_model.model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).last_hidden_state
    logp = naive_token_logprobs(hidden, ref_model.lm_head.weight, mb.targets)
    lengths = mb.loss_mask.sum(-1)
    # on-policy GRPO surrogate: -(1/B) sum_i (1/|o_i|) sum_t A_i logp (ratio 1, its gradient)
    (-(logp * mb.advantages * mb.loss_mask).sum(-1).div(lengths).mean()).backward()
    reference = _flat_grad(ref_model)
    ref_logp = logp.detach().cpu()
    del ref_model, hidden, logp
    _reset(args.device)
    out = {}
    for dtype in ("bf16", "bf16-pure"):
        model = fresh_model(cfg, args.device, state=state)
        config = GRPOConfig(out="/tmp/bench", dtype=dtype, device=args.device, lr=1e-6, max_len=args.seq_len + 1)
        trainer = GRPOTrainer(config, model=model)
        lp = trainer._logprobs(model, mb)
        (-(lp * mb.advantages * mb.loss_mask).sum(-1).div(lengths).mean()).backward()
        trainer.precision.after_backward()
        master = trainer.precision.master  # bf16-pure: the gradients live in the fp32 accumulators
        grad = torch.cat([m.grad.flatten() for m in master]) if master is not None else _flat_grad(model)
        err = float((grad - reference).norm() / reference.norm())
        out[f"ours, --dtype {dtype} (fp32 logits)"] = err
    if mods is not None:
        data_mod, model_mod, _, training_mod, TrainingConfig, _ = mods
        model = model_mod._load_model_with_attention(cfg, from_config=True)
        model.load_state_dict({k: v.to(torch.bfloat16) for k, v in state.items()})
        model = model.to(args.device)
        # its loss needs inference logprobs: give it the fp32 reference's own, so its ratio is ~1 and the
        # gradient is the same on-policy gradient as the reference's (position t+1 holds the logprob of
        # token t+1, which the shifted reference row holds at t)
        item = copy.deepcopy(one[0].to_scored_data())
        item["inference_logprobs"] = [
            [1.0] + row[: len(tok) - 1] for row, tok in zip(ref_logp.tolist(), item["tokens"], strict=True)
        ]
        tokens, labels, adv, temps, inf = data_mod.pad_data_to_good_offset({"batch": [item]}, one[0].size)
        loss, _ = training_mod.compute_grpo_loss(
            model,
            tokens[0].to(args.device),
            labels[0].to(args.device),
            adv[0].to(args.device),
            temps[0],
            1,
            inf[0].to(args.device),
        )
        loss.backward()
        out["Atropos example_trainer (bf16)"] = float((_flat_grad(model) - reference).norm() / reference.norm())
        del model
    torch.backends.cuda.matmul.allow_tf32 = True
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny config (smoke test of the script)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seqs", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument(
        "--ours",
        default="8192:0:1:bf16-pure,8192:0:1:bf16-pure:1,4096:0:1:bf16-pure,8192:0:1:bf16-pure:0:0.5,16384:1:1:bf16-pure",
        help="variants micro_tokens:checkpointing:compile:dtype[:pack[:activation_budget]], comma-separated",
    )
    parser.add_argument("--atropos", default="2:1,32:1,8:0", help="variants micro_batch:checkpointing")
    parser.add_argument("--out", default=None, help="also write the markdown table here")
    args = parser.parse_args()

    cfg = qwen_config(args.tiny)
    state = {k: v.cpu() for k, v in fresh_model(cfg, "cpu").state_dict().items()}
    groups = make_groups(args.seqs, args.seq_len, 8, cfg.vocab_size, seed=0)
    probe = fresh_model(cfg, "meta")
    fpt = flops_per_token(probe, args.seq_len)
    n_params = sum({v.data_ptr(): v.numel() for v in state.values()}.values())  # tied weights once
    tokens = args.seqs * args.seq_len
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    lines = [
        f"# trainer benchmark: {device_name}, torch {torch.__version__}",
        f"model: Qwen2.5-0.5B-shaped, {n_params / 1e6:.0f}M params, random weights; step = {args.seqs} x "
        f"{args.seq_len} tokens; {args.steps} timed steps after {args.warmup} warm-up; "
        f"{fpt / 1e9:.2f} GFLOP/token",
        "",
        "| trainer | setting | tokens/s | MFU | peak GiB | s/step |",
        "|---|---|---|---|---|---|",
    ]

    def row(name, setting, per_step, peak):
        tps = tokens / per_step
        line = f"| {name} | {setting} | {tps:,.0f} | {tps * fpt / PEAK_FLOPS:.1%} | {peak:.1f} | {per_step:.3f} |"
        lines.append(line)
        print(line, flush=True)

    for spec in filter(None, args.ours.split(",")):
        variant = parse_variant(spec)
        setting = describe(variant)
        try:
            row("ours", setting, *bench_ours(args, cfg, state, groups, variant))
        except Exception as exc:  # a benchmark row that fails is reported, the others still run
            lines.append(f"| ours | {setting} | failed: {type(exc).__name__}: {str(exc)[:160]} | | | |")
            print(lines[-1], flush=True)
    mods = None
    try:
        mods = load_example_trainer()
        if mods[-1]:
            lines.append(f"note: {mods[-1]}")
    except Exception as exc:
        lines.append(f"Atropos example_trainer not importable: {type(exc).__name__}: {exc}")
    for spec in filter(None, args.atropos.split(",") if mods else []):
        micro, ckpt = (int(x) for x in spec.split(":"))
        setting = f"micro-batch {micro} seqs, ckpt {'on' if ckpt else 'off'}"
        try:
            row("Atropos example_trainer", setting, *bench_atropos(args, cfg, state, groups, micro, bool(ckpt), mods))
        except Exception as exc:
            lines.append(f"| Atropos | {setting} | failed: {type(exc).__name__}: {str(exc)[:120]} | | | |")
            print(lines[-1], flush=True)
    import atropos_cli.trainer.logprobs as lp

    lines.append(f"LM-head matmul: {'bf16 inputs, fp32 output (torch.mm out_dtype)' if lp.MIXED_MM else 'fp32'}")
    lines += ["", "| gradient vs fp32 reference | relative L2 error |", "|---|---|"]
    for name, err in grad_errors(args, cfg, state, groups, mods).items():
        lines.append(f"| {name} | {err:.2e} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    assert math.isfinite(fpt)


if __name__ == "__main__":
    main()
