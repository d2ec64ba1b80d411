"""Where a decode step of the rollout engine goes: GPU time per kernel, the graph replay's time, the host's share.

    python benchmarks/profile_engine.py --batches 64,512 --out /tmp/engine_profile.md
    python benchmarks/profile_engine.py --family Qwen3-0.6B --batches 512       # a published shape of families.py
    python benchmarks/profile_engine.py --tiny --device cpu --batches 8 --new-tokens 16     # smoke test

Same model and rows as `bench_generation.py` (Qwen2.5-0.5B shape, random weights, bf16, 256-token prompts, 256
sampled tokens a row, groups of 8). For each batch: the engine's first call (compile, capture), then
(1) a timed second call, and a third with each replay waited for, split into graph replays (GPU) and the
host's work between them (reading tokens, stop checks, refills), (2) one captured graph (`sync_every` steps)
replayed alone, per step, (3) a torch.profiler table of the compiled step run without the graph: kernels
grouped by kind, GPU time per step and launches.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generation import (  # noqa: E402
    IdTokenizer,
    _emit,
    _sync,
    batch_prompts,
    build_model,
    engine_rows,
    workload_args,
)

KINDS = [  # (label, substrings of a kernel's name), first match wins
    ("decode attention (Triton)", ("decode_kernel",)),
    ("attention (other)", ("attention", "fmha", "flash")),
    ("matrix products", ("gemm", "sm90", "cutlass", "ampere", "splitk", "cublas", "nvjet", "matmul", "mm_")),
    ("sampler / reductions", ("argmax", "logsumexp", "red_fused", "per_fused")),
    ("fused elementwise", ("poi_fused", "triton_")),
    ("copies / scatter", ("copy", "index", "scatter", "elementwise")),
]


def kind_of(name: str) -> str:
    low = name.lower()
    for label, keys in KINDS:
        if any(k in low for k in keys):
            return label
    return "other"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workload_args(parser, "64,512")
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--attention", default=None, help="triton, fused or plain (default: the engine's)")
    parser.add_argument("--top", type=int, default=25, help="kernels listed by name")
    parser.add_argument("--family", default=None, help="a shape of atropos_cli/families.py")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    import atropos_cli.inference.engine as engine_module
    from atropos_cli.inference.engine import StaticEngine, engine_shape

    engine_module.ATTENTION = args.attention
    cuda = args.device.startswith("cuda")
    if args.family:
        from atropos_cli import families

        dtype = torch.bfloat16 if cuda else torch.float32
        model = families.build(args.family, tiny=args.tiny, dtype=dtype, device=args.device)
        model.generation_config.eos_token_id = None
    else:
        model = build_model(args.tiny, args.device)
    name = torch.cuda.get_device_name() if cuda else "cpu"
    lines = [
        f"# engine profile: {args.family or 'Qwen2.5-0.5B'} on {name}, torch {torch.__version__}, "
        f"attention {engine_module.attention_kind(cuda)}",
        f"{args.prompt_tokens}-token prompts, {args.new_tokens} sampled tokens a row, groups of {args.group}",
    ]
    for batch in (int(b) for b in args.batches.split(",")):
        prompts = batch_prompts(model.config.vocab_size, batch, args.prompt_tokens)  # bench_generation's rows
        rows = engine_rows(prompts, args.new_tokens, args.group)
        engine = StaticEngine(model, IdTokenizer(), engine_shape(rows, batch))
        started = time.perf_counter()
        engine.run(rows)
        _sync(args.device)
        first = time.perf_counter() - started

        # (1) a plain call (the host's work overlaps the next replay), then one with every replay timed alone
        started = time.perf_counter()
        out = engine.run(rows)
        _sync(args.device)
        wall = time.perf_counter() - started
        replay_s = [0.0]
        original = engine._run_steps

        def timed(use_top_p: bool, bucket: int, original=original, replay_s=replay_s) -> None:
            _sync(args.device)
            t0 = time.perf_counter()
            original(use_top_p, bucket)
            _sync(args.device)
            replay_s[0] += time.perf_counter() - t0

        engine._run_steps = timed  # type: ignore[method-assign]
        started = time.perf_counter()
        engine.run(rows)
        _sync(args.device)
        serial = time.perf_counter() - started
        engine._run_steps = original  # type: ignore[method-assign]
        tokens = sum(len(r.token_ids) for r in out)
        steps = args.new_tokens - 1  # the prefill samples the first token
        lines += [
            "",
            f"## batch {batch} (engine {engine.shape}, first call {first:.1f} s)",
            "",
            "| part | s | per decode step ms |",
            "|---|---|---|",
            f"| whole call ({tokens / wall:,.0f} tok/s) | {wall:.3f} | {1000 * wall / steps:.3f} |",
            f"| a call with each replay waited for ({tokens / serial:,.0f} tok/s) | {serial:.3f} | "
            f"{1000 * serial / steps:.3f} |",
            f"| its replays | {replay_s[0]:.3f} | {1000 * replay_s[0] / steps:.3f} |",
            f"| its rest (prefill, host reads and checks) | {serial - replay_s[0]:.3f} | "
            f"{1000 * (serial - replay_s[0]) / steps:.3f} |",
        ]
        # (2) one graph alone, replayed back to back
        bucket = engine.shape.gen_len
        if cuda and engine._graphs:
            graph = engine._graphs.get((False, bucket)) or next(iter(engine._graphs.values()))
            engine.column.zero_()  # the graph writes its steps' outputs from this column on
            graph.replay()
            _sync(args.device)
            t0 = time.perf_counter()
            for _ in range(10):
                engine.column.zero_()
                graph.replay()
            _sync(args.device)
            per_step = (time.perf_counter() - t0) / (10 * engine.sync_every)
            lines.append(f"| one graph replayed alone (bucket {bucket}), a step | | {1000 * per_step:.3f} |")
        # (3) kernels of the compiled step without the graph
        from torch.profiler import ProfilerActivity, profile

        engine.cache.bucket = bucket
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        reps = 5
        with torch.inference_mode():
            engine.column.zero_()
            engine._step_fn(False)
            _sync(args.device)
            with profile(activities=activities) as prof:
                for _ in range(reps):
                    engine.column.zero_()  # the step writes its outputs at this column
                    engine._step_fn(False)
                _sync(args.device)
        by_kind: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
        by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
        for evt in prof.key_averages():
            dev_us = getattr(evt, "self_device_time_total", 0) or getattr(evt, "self_cuda_time_total", 0)
            if dev_us <= 0 or evt.device_type != torch.autograd.DeviceType.CUDA:
                continue
            for table, key in ((by_kind, kind_of(evt.key)), (by_name, evt.key)):
                table[key][0] += dev_us / reps
                table[key][1] += evt.count / reps
        total = sum(v[0] for v in by_kind.values())
        lines += [
            "",
            f"Compiled step without the graph (bucket {bucket}): {total / 1000:.3f} ms of kernels a step, "
            f"{sum(v[1] for v in by_kind.values()):.0f} kernels a step.",
            "",
            "| kernel kind | GPU ms a step | kernels a step | share |",
            "|---|---|---|---|",
        ]
        for key, (us, n) in sorted(by_kind.items(), key=lambda kv: -kv[1][0]):
            lines.append(f"| {key} | {us / 1000:.3f} | {n:.0f} | {100 * us / max(total, 1e-9):.1f}% |")
        lines += ["", "| kernel | GPU us a step | launches a step |", "|---|---|---|"]
        for key, (us, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[: args.top]:
            lines.append(f"| {key[:110]} | {us:.1f} | {n:.0f} |")
        print("\n".join(lines), flush=True)
        del engine
        if cuda:
            torch.cuda.empty_cache()
    _emit(lines, args.out)


if __name__ == "__main__":
    main()
