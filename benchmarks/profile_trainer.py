"""Where a GRPO step's GPU time goes: a torch.profiler table of one step, and the LM-head path timed alone.

    python benchmarks/profile_trainer.py --variant 8192:0:1:bf16-pure     # same variant syntax as bench_trainer

Prints (1) the top kernels of one profiled step by GPU time and how busy the GPU was, (2) the chunked LM-head
log-prob function (forward + backward on 8192 tokens of a Qwen2.5-0.5B-sized head) with the fused chunk kernels
on and off, against the time of its four matrix products alone, and its error against an fp32 reference.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_trainer import fresh_model, make_groups, parse_variant, qwen_config


def profile_step(args, cfg, groups) -> None:
    from torch.profiler import ProfilerActivity, profile

    from atropos_cli.trainer.step.grpo import GRPOConfig, GRPOTrainer

    v = parse_variant(args.variant)
    model = fresh_model(cfg, "cuda")
    config = GRPOConfig(
        out="/tmp/prof", dtype=v["dtype"], device="cuda", micro_batch_tokens=v["micro"],
        gradient_checkpointing=v["ckpt"], compile=v["compile"], pack=v["pack"],
        activation_memory_budget=v["budget"], lr=1e-6, max_len=args.seq_len + 1,
    )  # fmt: skip
    trainer = GRPOTrainer(config, model=model)
    for _ in range(2):
        trainer.step(groups)
    torch.cuda.synchronize()
    for _ in range(3):  # step-to-step spread
        started = time.perf_counter()
        trainer.step(groups)
        torch.cuda.synchronize()
        print(f"step {time.perf_counter() - started:.3f} s")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        started = time.perf_counter()
        trainer.step(groups)
        torch.cuda.synchronize()
        wall = time.perf_counter() - started
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA" or e.self_device_time_total > 0]
    busy = sum(e.self_device_time_total for e in events) / 1e6
    print(f"step wall {wall:.3f} s, GPU kernels {busy:.3f} s ({busy / wall:.0%} busy)")
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=args.rows, max_name_column_width=60))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60))


def lm_head(args, cfg) -> None:
    import atropos_cli.trainer.step.logprobs as lp

    n, h, v = args.head_tokens, cfg.hidden_size, cfg.vocab_size
    gen = torch.Generator(device="cuda").manual_seed(0)
    hidden = (torch.randn(n, h, device="cuda", generator=gen) * 2).bfloat16().requires_grad_(True)
    weight = (torch.randn(v, h, device="cuda", generator=gen) * 0.02).bfloat16().requires_grad_(True)
    targets = torch.randint(0, v, (n,), device="cuda", generator=gen)
    grad = torch.randn(n, device="cuda", generator=gen)

    def run():
        out = lp.flat_token_logprobs(hidden, weight, targets, None, args.chunk)
        out.backward(grad)
        return out

    def bench(fn, reps=10):
        fn()
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(reps):
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return sorted(times)[len(times) // 2]

    def four_mms():
        w = weight.detach()
        for s in range(0, n, args.chunk):
            x = hidden.detach()[s : s + args.chunk]
            logits = torch.mm(x, w.t(), out_dtype=torch.float32)
            torch.mm(logits.bfloat16(), w, out_dtype=torch.float32)
            torch.mm(x, w.t(), out_dtype=torch.float32)
            torch.mm(logits.bfloat16().t(), x, out_dtype=torch.float32)

    print(f"\nLM head: {n} tokens x {v} vocab x {h} hidden, chunk {args.chunk}")
    print(f"  four matrix products alone: {bench(four_mms):.2f} ms")
    for fuse in (False, True):
        lp.FUSE = fuse
        lp._KERNELS.clear()
        ms = bench(run)
        print(f"  flat_token_logprobs fwd+bwd, fused chunk kernels {'on ' if fuse else 'off'}: {ms:.2f} ms")
    # correctness on a slice against fp32 full logits
    m = 512
    hs, ws = hidden.detach()[:m].float().requires_grad_(True), weight.detach().float().requires_grad_(True)
    ref = torch.log_softmax(hs @ ws.t(), -1).gather(1, targets[:m, None]).squeeze(1)
    ref.backward(grad[:m])
    hb, wb = hidden.detach()[:m].clone().requires_grad_(True), weight.detach().clone().requires_grad_(True)
    ours = lp.flat_token_logprobs(hb, wb, targets[:m], None, 128)
    ours.backward(grad[:m])
    rel = lambda a, b: float((a.float() - b).norm() / b.norm())  # noqa: E731
    print(
        f"  vs fp32: logp {rel(ours, ref):.1e}, grad_h {rel(hb.grad, hs.grad):.1e}, grad_W {rel(wb.grad, ws.grad):.1e}"
    )
    print(f"  torch.addmm out_dtype in place: {'used' if lp.MIXED_ADDMM else 'unsupported, fell back'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="8192:0:1:bf16-pure")
    parser.add_argument("--seqs", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--rows", type=int, default=30)
    parser.add_argument("--head-tokens", type=int, default=8192)
    parser.add_argument("--chunk", type=int, default=1024)
    parser.add_argument("--skip-step", action="store_true")
    parser.add_argument("--skip-head", action="store_true")
    parser.add_argument("--mixed", action="store_true", help="lengths uniform in [min-len, seq-len]")
    parser.add_argument("--min-len", type=int, default=128)
    args = parser.parse_args()

    cfg = qwen_config(False)
    if not args.skip_head:
        lm_head(args, cfg)
    if not args.skip_step:
        min_len = args.min_len if args.mixed else None
        profile_step(args, cfg, make_groups(args.seqs, args.seq_len, 8, cfg.vocab_size, seed=0, min_len=min_len))


if __name__ == "__main__":
    main()
