"""Rollout generation on a GPU: our local engine vs transformers `generate` (vLLM where installed), same model,
same prompts, same card, same run; then the one-command loop's step split (generation / scoring / training).

    python benchmarks/bench_generation.py --out benchmarks/results/generation_gpu.md
    python benchmarks/bench_generation.py --tiny --device cpu --batches 4 --new-tokens 8 --no-loop   # smoke test

Model: Qwen2.5-0.5B-shaped, random weights, bf16 (no download); prompts of 256 random token ids, 256 sampled
tokens a row (no EOS: every row runs to its budget), temperature 1, top-p 1. Reported: completion tokens/s
(one warm-up call per batch size first: graph capture / compilation excluded, reported separately).
"ours" = `StaticEngine.run` (what `LocalBackend` uses on CUDA); "ours, loop" = the CPU path `sample_rows`.
The loop split runs `atropos train arithmetic` on the same shape with a 384-token vocabulary (the shipped tiny
tokenizer: 358M parameters) and reads `metrics.jsonl`: generate_s (sampling), step_time_s (the optimizer step),
sync_s, the rest of the step's wall time (env scoring, batching, the trainer's bookkeeping) and engine_batches
(the engine batches a step's rollouts took: 1 when the step's 32 x 8 rows came together).

    python benchmarks/bench_generation.py --loop-only --loop-steps 5   # only the loop split (loop_split.sh)

Model families (`--family`, published shapes of `atropos_cli.families`, full depth, random weights, bf16): per
shape, the engine's exactness on the card (raw logprobs of rows running past the sliding window against the
family's own transformers attention), then ours (8 rollouts a prompt, compiled step, default decode attention)
beside transformers `generate` at each batch size, and tokens/s x parameters:

    python benchmarks/bench_generation.py --family Qwen2.5-0.5B,Qwen3-0.6B,Gemma-3-1B --batches 64,512 --out f.md
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_trainer import qwen_config  # noqa: E402


class IdTokenizer:
    """Token ids as text (the benchmark's random model has no tokenizer); no EOS, so rows run to budget."""

    eos_token_id = None
    pad_token_id = 0

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return " ".join(map(str, ids))


def build_model(tiny: bool, device: str, vocab: int | None = None):
    from transformers import AutoModelForCausalLM

    cfg = qwen_config(tiny)
    if vocab is not None:
        cfg.vocab_size = vocab
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa").to(device).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def workload_args(parser: argparse.ArgumentParser, batches: str) -> None:
    """The model and rows every engine benchmark runs (this script, profile_engine.py)."""
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batches", default=batches)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=256)


def batch_prompts(vocab: int, batch: int, tokens: int) -> list[list[int]]:
    """`batch` random prompts of `tokens` ids, seeded by the batch size."""
    gen = torch.Generator().manual_seed(batch)
    return torch.randint(1, vocab, (batch, tokens), generator=gen).tolist()


def engine_rows(prompts: list[list[int]], new: int, group: int) -> list:
    """One row per prompt slot, `group` rollouts a prompt (prompt i // group for row i), seeded by row."""
    from atropos_cli.inference.sampler import RowRequest

    return [
        RowRequest(prompt_ids=prompts[i // group], max_new_tokens=new, temperature=1.0, seed=i)
        for i in range(len(prompts))
    ]


def ours(model, prompts: list[list[int]], new: int, device: str, group: int, compile_step: bool | None = None):
    """Our engine on rows of `group` rollouts a prompt (`engine_rows`): (completion tok/s, first call s,
    results)."""
    from atropos_cli.inference.engine import StaticEngine, engine_shape

    rows = engine_rows(prompts, new, group)
    engine = StaticEngine(model, IdTokenizer(), engine_shape(rows, len(rows)), compile_step=compile_step)
    started = time.perf_counter()
    engine.run(rows)  # warm-up: CUDA graph capture, compilation
    _sync(device)
    first = time.perf_counter() - started
    started = time.perf_counter()
    out = engine.run(rows)
    _sync(device)
    return sum(len(r.token_ids) for r in out) / (time.perf_counter() - started), first, out


def ours_loop(model, prompts: list[list[int]], new: int, device: str) -> float:
    from atropos_cli.inference.sampler import RowRequest, sample_rows

    rows = [RowRequest(prompt_ids=p, max_new_tokens=new, temperature=1.0, seed=i) for i, p in enumerate(prompts)]
    started = time.perf_counter()
    out = sample_rows(model, IdTokenizer(), rows)
    _sync(device)
    return sum(len(r.token_ids) for r in out) / (time.perf_counter() - started)


def hf_generate(model, prompts: list[list[int]], new: int, device: str, group: int) -> float:
    ids = torch.tensor([prompts[i // group] for i in range(len(prompts))], device=device)
    kwargs = {"max_new_tokens": new, "min_new_tokens": new, "do_sample": True, "temperature": 1.0, "top_p": 1.0}
    with torch.inference_mode():
        model.generate(ids[:, :8], attention_mask=torch.ones_like(ids[:, :8]), **{**kwargs, "max_new_tokens": 4})
        _sync(device)
        started = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        _sync(device)
    return (out.shape[1] - ids.shape[1]) * ids.shape[0] / (time.perf_counter() - started)


def check_contract(model, device: str, vocab: int) -> list[str]:
    """On the card itself: raw logprobs = a forward pass; a seeded row is the same in two calls and alone."""
    from atropos_cli.inference.engine import EngineShape, StaticEngine, engine_shape
    from atropos_cli.inference.sampler import RowRequest

    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, vocab, (n,), generator=gen).tolist() for n in (5, 17, 9, 30, 12, 3)]
    rows = [
        RowRequest(prompt_ids=p, max_new_tokens=24, temperature=0.8, top_p=0.9 if i % 2 else 1.0, seed=7 + i)
        for i, p in enumerate(prompts)
    ]
    rows += [RowRequest(**{**vars(r), "seed": 100 + i}) for i, r in enumerate(rows[:2] * 3)]  # groups of 4
    shape = engine_shape(rows, 8)
    a = StaticEngine(model, IdTokenizer(), shape, sync_every=5).run(rows)  # groups queue for 2 group slots
    # the comparisons run eagerly (each new shape would compile the step again: a minute each on the GPU)
    b = StaticEngine(model, IdTokenizer(), EngineShape(1, 16, shape.prompt_len, shape.gen_len), compile_step=False)
    b_out = b.run(rows)
    alone = StaticEngine(model, IdTokenizer(), engine_shape(rows[3:4], 8), compile_step=False).run(rows[3:4])
    worst = 0.0
    for p, r in zip([r.prompt_ids for r in rows], a, strict=True):
        with torch.inference_mode():
            logits = model(torch.tensor([p + r.token_ids], device=device)).logits[0].float()
        ref = torch.log_softmax(logits, -1)[len(p) - 1 : -1].gather(
            1, torch.tensor(r.token_ids, device=device)[:, None]
        )
        worst = max(worst, float((ref[:, 0].cpu() - torch.tensor(r.logprobs)).abs().max()))
    same = sum(x.token_ids == y.token_ids for x, y in zip(a, b_out, strict=True))
    return [
        f"- logprobs vs a forward pass of prompt + completion: max |diff| {worst:.3g}",
        f"- seeded rows, groups of 4 sharing a prompt block (queued) vs a block per row: {same}/{len(rows)} identical",
        f"- seeded row alone vs batched: {'identical' if alone[0].token_ids == a[3].token_ids else 'differs'}",
    ]


def family_exactness(model, device: str, window: int | None) -> float:
    """Max |engine raw logprob - the family's own attention forward| over greedy and sampled rows whose prompt
    and completion together run past the sliding window (bf16 on the card: rounding, not a wrong mask)."""
    from atropos_cli.inference.engine import StaticEngine, engine_shape
    from atropos_cli.inference.sampler import RowRequest

    vocab = model.config.vocab_size
    prompt_len = min(window or 96, 2048) + 40  # past the window where it is short enough to reach
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(1, vocab, (prompt_len + 9 * i,), generator=gen).tolist() for i in range(2)]
    rows = [RowRequest(prompt_ids=p, max_new_tokens=48, temperature=t, seed=i) for p in prompts for i, t in
            enumerate((0.0, 1.0))]  # fmt: skip
    own = model.config._attn_implementation
    out = StaticEngine(model, IdTokenizer(), engine_shape(rows, 8), compile_step=False).run(rows)
    model.set_attn_implementation(own)
    worst = 0.0
    for row, result in zip(rows, out, strict=True):
        ids = row.prompt_ids + result.token_ids
        with torch.inference_mode():
            logits = model(torch.tensor([ids], device=device)).logits[0].float()
        ref = torch.log_softmax(logits[len(row.prompt_ids) - 1 : -1], -1)
        ref = ref.gather(1, torch.tensor(result.token_ids, device=device)[:, None])[:, 0].cpu()
        worst = max(worst, float((ref - torch.tensor(result.logprobs)).abs().max()))
    return worst


def family_rows(args) -> list[str]:
    """The `--family` table: each published shape's exactness and speed, ours beside `generate`."""
    import transformers

    from atropos_cli import families
    from atropos_cli.attention import describe
    from atropos_cli.inference.engine import refusal

    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    lines = [
        f"# model families: {name}, torch {torch.__version__}, transformers {transformers.__version__}",
        f"random weights, bf16, full depth; {args.prompt_tokens}-token prompts, {args.new_tokens} sampled tokens a "
        "row, 8 rows a prompt, temperature 1; ours = the static engine, compiled step, default decode attention",
        "",
        "| shape | params | attention | engine | max abs logprob diff vs own attention, past the window | batch "
        "| ours tok/s | ours first call s | generate tok/s | ours / generate | tok/s x B params |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    for shape in args.family.split(","):
        try:
            model = families.build(shape, dtype=dtype, device=args.device)
        except Exception as exc:  # one shape that does not fit this card still lets the rest run
            lines.append(f"| {shape} | | | build failed: {type(exc).__name__}: {str(exc)[:160]} | | | | | | | |")
            print(lines[-1], flush=True)
            continue
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        billions = sum(p.numel() for p in model.parameters()) / 1e9
        facts, refused = describe(model), refusal(model)
        windows = [w for w in facts.windows if w]
        engine = "yes" if refused is None else f"no: {refused}"
        try:
            exact = f"{family_exactness(model, args.device, max(windows) if windows else None):.3g}"
        except Exception as exc:
            exact = f"failed: {type(exc).__name__}: {str(exc)[:160]}"
        own = model.config._attn_implementation
        for batch in (int(b) for b in args.batches.split(",")):
            prompts = batch_prompts(model.config.vocab_size, batch, args.prompt_tokens)  # row i: prompt i // 8
            try:
                tps, first, _ = ours(model, prompts, args.new_tokens, args.device, 8, None)
                cell = f"{tps:,.0f} | {first:.1f}"
            except Exception as exc:
                tps, cell = None, f"failed: {type(exc).__name__}: {str(exc)[:160]} | "
            print(f"  {shape} batch {batch}: ours {cell} (tok/s | first call s); generate next", flush=True)
            torch.cuda.empty_cache() if args.device.startswith("cuda") else None
            hf = None
            if not args.no_generate:
                model.set_attn_implementation(own)
                try:
                    hf = hf_generate(model, prompts, args.new_tokens, args.device, 8)
                except torch.OutOfMemoryError:
                    hf = None
                torch.cuda.empty_cache() if args.device.startswith("cuda") else None
            ratio = f"{tps / hf:.1f}x" if tps and hf else "-"
            per = f"{tps * billions:,.0f}" if tps else "-"
            lines.append(
                f"| {shape} | {billions:.2f}B | {facts.kind} | {engine} | {exact} | {batch} | {cell} | "
                f"{f'{hf:,.0f}' if hf else '-'} | {ratio} | {per} |"
            )
            print(lines[-1], flush=True)
        del model
        torch.cuda.empty_cache() if args.device.startswith("cuda") else None
    return lines


def loop_split(args) -> list[str]:
    """`atropos train arithmetic` on the 0.5B shape (tiny tokenizer's vocabulary), its metrics per step."""
    from atropos_cli.inference.tokenizer import load_tokenizer
    from atropos_cli.resources import resolve_model_path

    work = Path(tempfile.mkdtemp(prefix="loop-"))
    tokenizer = load_tokenizer(resolve_model_path("atropos-tiny-arith"))
    model = build_model(args.tiny, "cpu", vocab=len(tokenizer))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(work / "model")
    tokenizer.save_pretrained(work / "model")
    params = sum(p.numel() for p in model.parameters())
    del model
    cmd = [
        sys.executable, "-m", "atropos_cli.cli.app", "train", "arithmetic", "--model", str(work / "model"),
        "--env.max_token_length", "256", "--steps", str(args.loop_steps), "--out", str(work / "run"), "--lr", "1e-6",
    ]  # fmt: skip
    started = time.perf_counter()
    note = ""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.loop_timeout)
        if proc.returncode:
            return [f"loop failed ({proc.returncode}): {proc.stderr[-1500:]}"]
    except subprocess.TimeoutExpired:  # the steps that finished are still in metrics.jsonl
        note = f" (stopped at --loop-timeout {args.loop_timeout:.0f} s)"
    wall = time.perf_counter() - started
    metrics = work / "run" / "metrics.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()] if metrics.is_file() else []
    lines = [
        f"`atropos train arithmetic --model <{'tiny' if args.tiny else '0.5B'} shape, {params / 1e6:.0f}M params, "
        "random> --env.max_token_length "
        f"256 --steps {args.loop_steps}` (defaults otherwise: 32 groups x 8 a step), {wall:.0f} s in all{note}:",
        "",
        "| step | wall s | generation s | scoring + other s | training s | weight sync s | engine batches "
        "| engines built | rollout tokens |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "step_time_s" not in r:
            continue
        loop, gen, train, sync = (r.get(k, 0.0) for k in ("loop_s", "generate_s", "step_time_s", "sync_s"))
        lines.append(
            f"| {r['step']} | {loop:.2f} | {gen:.2f} | {loop - gen - train - sync:.2f} | {train:.2f} | {sync:.2f} "
            f"| {r.get('engine_batches', '-')} | {r.get('engine_builds', '-')} | {r.get('padded_tokens', 0)} |"
        )
    later = [r["loop_s"] for r in rows if "step_time_s" in r and "loop_s" in r][1:]
    if later:
        lines += ["", f"Steps after the first: mean {sum(later) / len(later):.2f} s, worst {max(later):.2f} s a step."]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workload_args(parser, "64,256,512")
    parser.add_argument("--old-loop-batches", default="64", help="batch sizes that also time sample_rows (slow)")
    parser.add_argument(
        "--variants",
        default="8:1,1:1,8:0",
        help="rows of GROUP:COMPILE[:ATTENTION] (rollouts a prompt; 1 = compiled step; attention: t = the Triton "
        "decode kernel, f or 1 = torch's fused kernel per block, p or 0 = plain matmuls, a = the default)",
    )
    parser.add_argument(
        "--contract-attention",
        default="a",
        choices=["t", "f", "1", "p", "0", "a"],
        help="the contract's decode attention (letters as in --variants)",
    )
    parser.add_argument("--no-generate", action="store_true", help="skip transformers generate")
    parser.add_argument("--no-loop", action="store_true", help="skip the one-command loop split")
    parser.add_argument("--loop-steps", type=int, default=3)
    parser.add_argument("--loop-timeout", type=float, default=None, help="stop the loop after this many seconds")
    parser.add_argument("--loop-only", action="store_true", help="only the one-command loop split")
    parser.add_argument("--family", default=None, help="published shapes to run, comma-separated (families.py)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.family:
        _emit(family_rows(args), args.out)
        return
    if args.loop_only:
        _emit(loop_split(args), args.out)
        return

    model = build_model(args.tiny, args.device)
    vocab = model.config.vocab_size
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    import transformers

    lines = [
        f"# generation benchmark: {name}, torch {torch.__version__}, transformers {transformers.__version__}",
        f"Qwen2.5-0.5B-shaped, random weights, {model.dtype}; {args.prompt_tokens}-token prompts, "
        f"{args.new_tokens} sampled tokens a row, temperature 1",
        "",
    ]
    try:
        import vllm  # noqa: F401

        lines.append("vLLM is installed but not benchmarked by this script yet.")
    except ImportError:
        lines.append("vLLM: not installed on this machine (no row).")
    import atropos_cli.inference.engine as engine_module

    kinds = {"t": "triton", "f": "fused", "1": "fused", "p": "plain", "0": "plain", "a": None}
    engine_module.ATTENTION = kinds[args.contract_attention]
    default = engine_module.attention_kind(args.device.startswith("cuda"))
    try:
        lines += [f"- the contract below is checked with this decode attention: {default}"]
        lines += check_contract(model, args.device, vocab)
    except Exception as exc:  # the default kernel refused here: say so and measure the rest
        lines += [f"- contract check failed ({default}): {type(exc).__name__}: {str(exc)[:300]}"]
    print("\n".join(lines), flush=True)

    variants = [(v.split(":") + ["a"])[:3] for v in args.variants.split(",")]  # group:compile[:attention]
    lines += [
        "",
        "| batch | rollouts a prompt | ours tok/s | step compiled | attention | ours first call s "
        "| transformers generate tok/s | ours / generate | ours, loop tok/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for batch in (int(b) for b in args.batches.split(",")):
        prompts = batch_prompts(vocab, batch, args.prompt_tokens)
        hf_by_group: dict[int, float] = {}
        for group_s, comp, attention in variants:
            group, compiled = int(group_s), comp == "1"
            engine_module.ATTENTION = kinds[attention]
            kernel = engine_module.attention_kind(args.device.startswith("cuda"))
            try:
                tps, first, _ = ours(model, prompts, args.new_tokens, args.device, group, compiled)
            except Exception as exc:  # a variant that fails here (a kernel this GPU refuses) still lets the rest run
                cause = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
                lines.append(f"| {batch} | {group} | failed: {type(exc).__name__}: {cause} | | {kernel} | | | | |")
                print(lines[-1], flush=True)
                continue
            if not hf_by_group and not args.no_generate:  # generate shares nothing: one row count, one time
                hf_by_group[0] = hf_generate(model, prompts, args.new_tokens, args.device, group)
            hf = hf_by_group.get(0)
            old = None
            if str(batch) in args.old_loop_batches.split(",") and group == 1 and not compiled:
                old = ours_loop(model, prompts, args.new_tokens, args.device)
            cells = [f"{hf:,.0f}" if hf else "-", f"{tps / hf:.1f}x" if hf else "-", f"{old:,.0f}" if old else "-"]
            lines.append(
                f"| {batch} | {group} | {tps:,.0f} | {'yes' if compiled else 'no'} | {kernel} | {first:.1f} | "
                + " | ".join(cells)
                + " |"
            )
            print(lines[-1], flush=True)
    del model
    if not args.no_loop:
        lines += ["", *loop_split(args)]
    _emit(lines, args.out)


def _emit(lines: list[str], out: str | None) -> None:
    text = "\n".join(lines)
    print(text)
    if out:
        Path(out).write_text(text + "\n")


if __name__ == "__main__":
    main()
