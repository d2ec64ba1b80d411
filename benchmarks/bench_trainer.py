"""GRPO optimizer steps: our trainer vs Atropos' example_trainer, same model, same batch, same card, same run.

What it measures, per variant: tokens/s over timed steps (after warm-up), MFU, peak GPU memory, and the
relative error of the policy-gradient (all parameters) against an fp32 reference (fp32 weights, fp32 logits,
TF32 off). The model is Qwen2.5-0.5B-shaped with random weights built from a config (no download); a step is
64 sequences x 1024 tokens (256 prompt tokens masked, 768 completion tokens trained), groups of 8.

    python benchmarks/bench_trainer.py                 # GPU, the full comparison (needs atroposlib's
                                                       # example_trainer importable for the Atropos rows)
    python benchmarks/bench_trainer.py --tiny --device cpu --steps 1   # a smoke test of the script itself
    python benchmarks/bench_trainer.py --isolate --repeat 3            # each row in fresh processes: the median

`--isolate` runs every row in a fresh process of its own (`--repeat` times, the median reported with the range):
on an H100 the first trainer row of a process ran up to ~8% slower than the same code in its third row, and
fresh processes of the same code spread 88.7-97.4k tok/s on mixed lengths (docs/benchmarks-history.md, 8a58fa7),
so rows that share a process, or one process a row, do not support a difference of a few percent.

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
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

# the package must be installed (pip install -e . here; its wheel on a GPU machine): `atropos_cli.trainer` lives in
# the top-level trainer/ folder, so putting src/ on sys.path is not enough
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


def make_groups(n_seqs: int, seq_len: int, group_size: int, vocab: int, seed: int, min_len: int | None = None):
    """Synthetic groups: every sequence `seq_len` tokens, or (min_len given) lengths uniform in
    [min_len, seq_len]; the first quarter of each sequence (at most 256 tokens) is the masked prompt."""
    from atropos_cli.types import ScoredGroup

    gen = torch.Generator().manual_seed(seed)
    groups = []
    for _ in range(n_seqs // group_size):
        lengths = [seq_len] * group_size
        if min_len is not None:
            lengths = torch.randint(min_len, seq_len + 1, (group_size,), generator=gen).tolist()
        tokens = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]
        masks = [[-100] * min(256, len(t) // 4) + t[min(256, len(t) // 4) :] for t in tokens]
        inf = [
            [1.0] * min(256, len(t) // 4) + (-torch.rand(len(t), generator=gen) * 12).tolist()[min(256, len(t) // 4) :]
            for t in tokens
        ]
        scores = torch.randint(0, 2, (group_size,), generator=gen).float().tolist()
        scores[0], scores[1] = 1.0, 0.0  # every group has signal
        groups.append(ScoredGroup(tokens=tokens, masks=masks, scores=scores, inference_logprobs=inf))
    return groups


def real_tokens(groups) -> int:
    return sum(len(t) for g in groups for t in g.tokens)


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


def graphs_compiled() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def time_steps(step, batches: list, warmup: int, device: str) -> dict:
    """Run `step(batch)` on the warm-up batches then time the rest: real tokens/s over the timed steps, the first
    step's seconds (compilation included) and graphs compiled after the warm-up (recompiles)."""
    _sync(device)
    started = time.perf_counter()
    step(batches[0])
    _sync(device)
    first = time.perf_counter() - started
    for batch in batches[1:warmup]:
        step(batch)
    _sync(device)
    graphs = graphs_compiled()
    started = time.perf_counter()
    ends = []  # each timed step's end (a step ends with a host sync: these cost the GPU queue nothing)
    for batch in batches[warmup:]:
        step(batch)
        _sync(device)
        ends.append(time.perf_counter())
    elapsed = ends[-1] - started
    timed = batches[warmup:]
    steps_ms = [round(1e3 * (b - a), 1) for a, b in zip([started, *ends[:-1]], ends, strict=True)]
    print(f"  timed steps (ms): {steps_ms}", flush=True)  # a slow row: uniform, or a few outliers?
    return {
        "s_per_step": elapsed / len(timed),
        "tokens_per_s": sum(real_tokens(b) for b in timed) / elapsed,
        "first_step_s": first,
        "recompiles": graphs_compiled() - graphs,
        "steps_ms": steps_ms,
    }


def bench_ours(args, cfg, state, batches, variant: dict):
    from atropos_cli.trainer.step.grpo import GRPOConfig, GRPOTrainer

    _reset(args.device)
    torch._dynamo.reset()
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
        lora_r=variant["lora"],
        cuda_graphs=False if "g" in variant["knobs"] else None,
        lr=1e-6,
        max_len=args.seq_len + 1,
    )
    import atropos_cli.trainer.step.attention as attention
    import atropos_cli.trainer.step.grpo as grpo

    knobs = variant["knobs"]  # the alternatives to the defaults: f filler rows, w whole-body compile,
    # d per-layer compile with every dimension dynamic, r repeated KV heads for GQA, e every micro-batch collated
    # before the first forward (the trainer collates each as the step reaches it), g no CUDA graphs, n no narrow
    # shapes run and recorded ahead (each recorded when it first comes)
    grpo.EXACT_ROWS = "f" not in knobs
    grpo.REGIONAL_COMPILE = False if "w" in knobs else ("dynamic" if "d" in knobs else True)
    attention.NATIVE_GQA = "r" not in knobs
    import atropos_cli.trainer.step.precision as precision

    precision.BUCKET = 1 if "b" in knobs else 32  # b: one add per bf16 gradient (no buckets)
    import atropos_cli.trainer.step.logprobs as logprobs

    logprobs._KERNELS.clear()  # each row compiles its own (a cold first step; run with the inductor caches off)
    trainer = GRPOTrainer(config, model=model)
    if "n" in knobs and trainer.graphs is not None:
        trainer.graphs.ahead = None
    if "e" in knobs:
        plan = trainer._micro_batches
        trainer._micro_batches = lambda samples: list(plan(samples))  # type: ignore[method-assign]
    result = time_steps(trainer.step, batches, args.warmup, args.device)
    result["peak"] = _peak(args.device)
    result["mode"] = trainer.pack
    graphs = trainer.graphs
    if graphs is not None:  # how the micro-batches ran: a row whose recordings failed must not pass for graphed
        result["graphs"] = f"{graphs.recorded} recorded, {graphs.replayed} replayed, {graphs.eager} eager"
        result["graphs"] += f", {graphs.warmups} narrow warm-ups" if graphs.warmups else ""
        result["graphs"] += f", {graphs.failures} failed recordings" if graphs.failures else ""
        result["graphs"] += f" ({sorted(set(graphs.errors))})" if graphs.errors else ""
        result["graphs"] += f", OFF: {graphs.failed}" if graphs.failed else ""
        print(f"  CUDA graphs: {result['graphs']}", flush=True)
    return result


def _tri(text: str) -> bool | None:
    return None if text == "a" else bool(int(text))


def parse_variant(spec: str) -> dict:
    """micro_tokens:checkpointing:compile:dtype[:pack[:activation_budget[:lora_r]]]; compile and pack take
    0, 1 or a (auto: GRPOConfig's default), e.g. 8192:0:a:auto:a is the default configuration."""
    parts = spec.split(":")
    return {
        "micro": None if parts[0] == "a" else int(parts[0]),  # a: the trainer's default
        "ckpt": bool(int(parts[1])),
        "compile": _tri(parts[2]),
        "dtype": parts[3],
        "pack": _tri(parts[4]) if len(parts) > 4 else False,
        "budget": float(parts[5]) if len(parts) > 5 and parts[5] not in ("", "-") else None,
        "lora": int(parts[6]) if len(parts) > 6 else 0,
        "knobs": parts[7] if len(parts) > 7 else "",
    }


def describe(v: dict) -> str:
    auto = v["compile"] is None and v["pack"] is None and v["dtype"] == "auto"
    text = "**defaults**: " if auto else ""
    text += f"{v['dtype']}, micro-batch {v['micro'] or 'default'} tokens, ckpt {'on' if v['ckpt'] else 'off'}"
    text += {None: "", True: ", compiled", False: ", eager"}[v["compile"]]
    text += {None: "", True: ", packed", False: ", padded"}[v["pack"]]
    text += f", activation budget {v['budget']}" if v["budget"] is not None else ""
    text += f", LoRA r={v['lora']}" if v["lora"] else ""
    names = {
        "f": "fixed-width rows + filler",
        "w": "whole-body compile",
        "d": "per-layer compile, all dims dynamic",
        "r": "GQA by repeated KV heads",
        "b": "one gradient add each (no buckets)",
        "e": "all micro-batches collated first",
        "g": "no CUDA graphs",
        "n": "no narrow shapes recorded ahead",
    }
    text += "".join(f", {names[k]}" for k in v["knobs"])
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


def bench_atropos(args, cfg, state, batches, micro: int, ckpt: bool, mods):
    data_mod, model_mod, trainers_mod, training_mod, TrainingConfig, _ = mods
    _reset(args.device)
    model = model_mod._load_model_with_attention(cfg, from_config=True)  # bf16 weights, as Atropos loads them
    model.load_state_dict({k: v.to(torch.bfloat16) for k, v in state.items()})
    model = model.to(args.device)
    n = sum(g.size for g in batches[0])
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
    copies = {id(b): {"batch": copy.deepcopy([g.to_scored_data() for g in b])} for b in batches}

    def step(groups):
        tokens, labels, adv, temps, inf = data_mod.pad_data_to_good_offset(copies[id(groups)], micro)
        training_mod.run_training_step(model, optimizer, tokens, labels, adv, temps, config, counter[0], inf)
        counter[0] += 1

    result = time_steps(step, batches, args.warmup, args.device)
    result["peak"] = _peak(args.device)
    return result


def _flat_grad(model) -> torch.Tensor:
    return torch.cat([p.grad.detach().float().flatten() for p in model.parameters() if p.grad is not None])


def grad_errors(args, cfg, state, groups, mods):
    """Relative L2 error of each path's gradient vs an fp32 reference, on the first group (8 sequences)."""
    from atropos_cli.trainer.step.batching import micro_batches, prepare
    from atropos_cli.trainer.step.grpo import GRPOConfig, GRPOTrainer
    from atropos_cli.trainer.step.logprobs import naive_token_logprobs

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
        config = GRPOConfig(
            out="/tmp/bench",
            dtype=dtype,
            device=args.device,
            lr=1e-6,
            max_len=args.seq_len + 1,
            pack=False,
            compile=False,
        )
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


DEFAULT_OURS = {
    "equal": "8192:0:a:auto:a,8192:0:1:bf16-pure:0",
    "mixed": "8192:0:a:auto:a,8192:0:0:bf16-pure:0,8192:0:1:bf16-pure:0,16384:1:a:auto:a,8192:0:a:auto:a:-:16",
}


def build_batches(args, cfg, lengths: str) -> list:
    """One batch per step (warm-up first): every step sees new lengths, as an RL run does."""
    min_len = args.min_len if lengths == "mixed" else None
    return [
        make_groups(args.seqs, args.seq_len, 8, cfg.vocab_size, seed=step, min_len=min_len)
        for step in range(args.warmup + args.steps)
    ]


def run_rows(args, cfg, state, lengths: str, mods, fpt_of, lines: list) -> None:
    batches = build_batches(args, cfg, lengths)
    per_token = [len(t) for b in batches for g in b for t in g.tokens]
    fpt = fpt_of(sum(n * n for n in per_token) / sum(per_token))  # attention FLOPs at the token-weighted length

    def row(name, setting, r):
        tps = r["tokens_per_s"]
        mfu = tps * fpt / PEAK_FLOPS
        line = (
            f"| {name} | {lengths} | {setting} | {tps:,.0f} | {mfu:.1%} | {r['peak']:.1f} | {r['s_per_step']:.3f} "
            f"| {r['first_step_s']:.1f} | {r['recompiles']} |"
        )
        lines.append(line)
        print(line, flush=True)

    specs = args.ours_equal if lengths == "equal" else args.ours_mixed
    rows = [("ours", spec) for spec in filter(None, specs.split(","))]
    rows += [("atropos", spec) for spec in filter(None, args.atropos.split(",") if mods else [])]
    for kind, spec in rows:
        name, setting = ("ours", describe(parse_variant(spec))) if kind == "ours" else ("Atropos", _atropos(spec))
        try:
            if args.isolate:
                r = _isolated(args, lengths, kind, spec)
                setting += r["spread"]
            else:
                r = _bench_row(args, cfg, state, batches, kind, spec, mods)
            if kind == "ours":
                row("ours", f"{setting} ({r['mode']})", r)
            else:
                row("Atropos example_trainer", setting, r)
        except Exception as exc:  # a benchmark row that fails is reported, the others still run
            lines.append(f"| {name} | {lengths} | {setting} | failed: {type(exc).__name__}: {str(exc)[:160]} |")
            print(lines[-1], flush=True)


def _atropos_spec(spec: str) -> tuple[int, bool]:
    """An Atropos row's `micro_batch:checkpointing`."""
    micro, ckpt = (int(x) for x in spec.split(":"))
    return micro, bool(ckpt)


def _atropos(spec: str) -> str:
    micro, ckpt = _atropos_spec(spec)
    return f"micro-batch {micro} seqs, ckpt {'on' if ckpt else 'off'}"


def _bench_row(args, cfg, state, batches, kind: str, spec: str, mods) -> dict:
    if kind == "ours":
        return bench_ours(args, cfg, state, batches, parse_variant(spec))
    return bench_atropos(args, cfg, state, batches, *_atropos_spec(spec), mods)


_ROW = "ROW_RESULT "  # a child's one result line (--child)


def _isolated(args, lengths: str, kind: str, spec: str) -> dict:
    """The row run `args.repeat` times, each in a fresh process of this script (--child); the run with the
    median tokens/s, and the range of all runs."""
    argv = [sys.executable, __file__, "--child", f"{kind}={spec}", "--lengths", lengths, "--device", args.device]
    argv += ["--seqs", str(args.seqs), "--seq-len", str(args.seq_len), "--min-len", str(args.min_len)]
    argv += ["--steps", str(args.steps), "--warmup", str(args.warmup)] + (["--tiny"] if args.tiny else [])
    argv += ["--family", args.family] if args.family else []
    runs = []
    for _ in range(args.repeat):
        done = subprocess.run(argv, capture_output=True, text=True)
        found = [line[len(_ROW) :] for line in done.stdout.splitlines() if line.startswith(_ROW)]
        if done.returncode or not found:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"child exited {done.returncode}: {tail[0]}")
        runs.append(json.loads(found[0]))
        last = runs[-1]
        graphs = f", CUDA graphs: {last['graphs']}" if "graphs" in last else ""
        speed = f"{last['tokens_per_s']:,.0f} tok/s"
        print(f"  {kind} {spec}, run {len(runs)}: {speed}, steps (ms) {last['steps_ms']}{graphs}")
    runs.sort(key=lambda r: r["tokens_per_s"])
    median = runs[(len(runs) - 1) // 2]  # the lower of the middle two for an even count
    speeds = [r["tokens_per_s"] for r in runs]
    spread = f", median of {len(runs)} fresh processes" if len(runs) > 1 else ", a fresh process"
    if len(runs) > 1:
        spread += f" ({min(speeds):,.0f}-{max(speeds):,.0f}; mean {statistics.mean(speeds):,.0f})"
    return {**median, "spread": spread}


def _child(args, cfg, state, mods) -> None:
    """--child: one row, printed as one JSON line for the parent (_isolated)."""
    kind, spec = args.child.split("=", 1)
    batches = build_batches(args, cfg, args.lengths)
    r = _bench_row(args, cfg, state, batches, kind, spec, mods)
    print(_ROW + json.dumps(r), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny config (smoke test of the script)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seqs", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=1024, help="the length (equal) or longest length (mixed)")
    parser.add_argument("--min-len", type=int, default=128, help="mixed: lengths uniform in [min-len, seq-len]")
    parser.add_argument("--lengths", default="equal,mixed", help="equal, mixed or both")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--ours-equal", default=DEFAULT_OURS["equal"], help="variants (parse_variant), comma-separated")
    parser.add_argument("--ours-mixed", default=DEFAULT_OURS["mixed"])
    parser.add_argument("--atropos", default="32:1", help="variants micro_batch:checkpointing")
    parser.add_argument("--family", default=None, help="a published shape of atropos_cli/families.py (Llama-3.2-1B)")
    parser.add_argument("--no-grad-check", action="store_true")
    parser.add_argument("--out", default=None, help="also write the markdown table here")
    parser.add_argument("--isolate", action="store_true", help="each row in fresh processes of its own")
    parser.add_argument("--repeat", type=int, default=1, help="with --isolate: processes a row (median reported)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)  # kind=spec: one row (--isolate)
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat is {args.repeat}; give at least 1 (processes a row with --isolate)")

    if args.family:  # a published shape of atropos_cli/families.py (its tiny shape with --tiny)
        from atropos_cli import families

        cfg = families.config_for(args.family, tiny=args.tiny)
    else:
        cfg = qwen_config(args.tiny)
    state = {k: v.cpu() for k, v in fresh_model(cfg, "cpu").state_dict().items()}
    probe = fresh_model(cfg, "meta")
    n_params = sum({v.data_ptr(): v.numel() for v in state.values()}.values())  # tied weights once
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    lines = [
        f"# trainer benchmark: {device_name}, torch {torch.__version__}",
        f"model: {args.family or 'Qwen2.5-0.5B'}-shaped, {n_params / 1e6:.0f}M params, random weights; "
        f"step = {args.seqs} sequences "
        f"(equal: {args.seq_len} tokens each; mixed: uniform in {args.min_len}-{args.seq_len}, new lengths every "
        f"step); {args.steps} timed steps after {args.warmup} warm-up steps",
        "",
        "| trainer | lengths | setting | real tokens/s | MFU | peak GiB | s/step | first step s | recompiles |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    mods = None
    try:
        mods = load_example_trainer()
        if mods[-1]:
            lines.insert(2, f"note: {mods[-1]}")
    except Exception as exc:
        lines.insert(2, f"Atropos example_trainer not importable: {type(exc).__name__}: {exc}")
    if args.child:
        _child(args, cfg, state, mods)
        return
    if args.isolate:
        lines[1] += f"; each row in fresh processes (--isolate, {args.repeat} a row)"
    for lengths in args.lengths.split(","):
        run_rows(args, cfg, state, lengths, mods, lambda n: flops_per_token(probe, n), lines)
    import atropos_cli.trainer.step.logprobs as lp

    lines.append(f"LM-head matmul: {'bf16 inputs, fp32 output (torch.mm out_dtype)' if lp.MIXED_MM else 'fp32'}")
    if not args.no_grad_check:
        groups = make_groups(8, args.seq_len, 8, cfg.vocab_size, seed=0)
        lines += ["", "| gradient vs fp32 reference | relative L2 error |", "|---|---|"]
        for name, err in grad_errors(args, cfg, state, groups, mods).items():
            lines.append(f"| {name} | {err:.2e} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
