"""Where a GRPO step's wall time goes, phase by phase: host ranges against what the GPU did meanwhile.

    python benchmarks/profile_timeline.py --variant 8192:0:a:auto:a --mixed --out /tmp/prof

The trainer's phases are wrapped in `torch.profiler.record_function` ranges from the outside (no trainer code
changes): host data prep (`prepare`, collation into micro-batches, the copy to the device), each micro-batch's
forward (body + LM head, loss) and backward, the precision step (grad clip, AdamW, master -> bf16 copy, zeroing)
and the metric sync. From the profiler's trace it prints, per step: host milliseconds per phase, GPU kernel
milliseconds launched from each phase (CUDA correlation ids), and the GPU's idle time split by the host phase
that was running while the GPU sat idle: that idle time is what a phase adds to the step. Then the top kernels
and host ops per step. Writes the trace (gzipped) and the tables under --out.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import functools
import gzip
import json
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_trainer import fresh_model, make_groups, parse_variant, qwen_config, real_tokens


def _wrap(owner, name: str, label: str) -> None:
    from torch.profiler import record_function

    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapped(*args, **kwargs):
        with record_function(label):
            return original(*args, **kwargs)

    setattr(owner, name, wrapped)


def annotate(trainer) -> None:
    import atropos_cli.trainer.step.batching as batching
    import atropos_cli.trainer.step.grpo as grpo
    import atropos_cli.trainer.step.losses as losses
    import atropos_cli.trainer.step.precision as precision

    _wrap(grpo, "prepare", "prep: prepare samples")
    _wrap(grpo.GRPOTrainer, "_micro_batches", "prep: plan micro-batches")
    _wrap(batching, "static_micro_batch", "prep: collate a micro-batch")  # static rows: as each is read
    _wrap(batching.MicroBatch, "to", "prep: micro-batch to device")
    _wrap(grpo.GRPOTrainer, "_logprobs", "fwd: body + LM head")
    _wrap(grpo, "policy_loss", "fwd: policy loss")
    _wrap(torch.Tensor, "backward", "bwd: backward")
    _wrap(precision.Precision, "after_backward", "bwd: after_backward")
    _wrap(precision.Precision, "step", "opt: precision.step")
    _wrap(torch.nn.utils, "clip_grad_norm_", "opt: clip_grad_norm")
    _wrap(torch, "_foreach_copy_", "opt: master -> bf16 copy")
    _wrap(trainer.optimizer, "step", "opt: AdamW")
    _wrap(losses.LossStats, "floats", "sync: metrics .floats()")
    _wrap(grpo.GRPOTrainer, "step", "STEP")


def _union(intervals):
    merged = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return merged


def analyse(trace: dict, steps: int) -> str:
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    ranges = [e for e in events if e.get("cat") == "user_annotation"]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    runtime = {
        e["args"]["correlation"]: e["ts"]
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "args" in e
    }
    # the last `steps` steps only: the first steps under the profiler recompile the LM-head kernels
    step_ranges = sorted((e["ts"], e["ts"] + e["dur"]) for e in ranges if e["name"] == "STEP")[-steps:]
    window = (step_ranges[0][0], step_ranges[-1][1])
    gpu = [k for k in gpu if window[0] <= k["ts"] <= window[1]]
    phases = [(e["ts"], e["ts"] + e["dur"], e["name"]) for e in ranges if e["name"] != "STEP"]
    phases.sort()

    def innermost(t: float) -> str:
        best = None
        for s, e, name in phases[: bisect.bisect_right(phases, (t, float("inf"), ""))]:
            if s <= t <= e and (best is None or s >= best[0]):
                best = (s, name)
        return best[1] if best else "(outside any phase)"

    host = collections.defaultdict(float)
    count = collections.Counter()
    for s, e, name in phases:
        if any(a <= s <= b for a, b in step_ranges):
            host[name] += (e - s) / 1e3
            count[name] += 1
    device = collections.defaultdict(float)
    for k in gpu:
        launched = runtime.get(k.get("args", {}).get("correlation"))
        device[innermost(launched) if launched is not None else "(no launch record)"] += k["dur"] / 1e3
    idle = collections.defaultdict(float)
    wall = busy = 0.0
    for a, b in step_ranges:
        wall += (b - a) / 1e3
        merged = _union(
            [(max(k["ts"], a), min(k["ts"] + k["dur"], b)) for k in gpu if k["ts"] < b and k["ts"] + k["dur"] > a]
        )
        busy += sum(e - s for s, e in merged) / 1e3
        cursor = a
        for s, e in [*merged, [b, b]]:
            t = cursor
            while t < s:  # the idle gap [cursor, s], sampled every 20 us
                idle[innermost(t)] += min(20.0, s - t) / 1e3
                t += 20.0
            cursor = max(cursor, e)
    lines = [
        f"profiled steps: {steps}; per step: wall {wall / steps:.1f} ms, GPU busy {busy / steps:.1f} ms "
        f"({busy / wall:.0%}), GPU idle {(wall - busy) / steps:.1f} ms",
        "",
        "| phase | calls/step | host ms/step | GPU kernel ms/step launched here | GPU idle ms/step while host here |",
        "|---|---|---|---|---|",
    ]
    names = sorted(set(host) | set(device) | set(idle), key=lambda n: -(idle.get(n, 0) + device.get(n, 0)))
    for n in names:
        lines.append(
            f"| {n} | {count[n] / steps:.1f} | {host.get(n, 0) / steps:.1f} | {device.get(n, 0) / steps:.1f} "
            f"| {idle.get(n, 0) / steps:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    from torch.profiler import ProfilerActivity, profile

    from atropos_cli.trainer.step.grpo import GRPOConfig, GRPOTrainer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="8192:0:a:auto:a")
    parser.add_argument("--mixed", action="store_true")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timed", type=int, default=3)
    parser.add_argument("--profiled", type=int, default=2)
    parser.add_argument("--out", default="/tmp/prof")
    parser.add_argument("--tiny", action="store_true", help="a tiny model on the CPU (smoke test of the script)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    cfg = qwen_config(args.tiny)
    device = "cpu" if args.tiny else "cuda"
    n = args.warmup + args.timed + args.profiled
    batches = [make_groups(64, 1024, 8, cfg.vocab_size, seed=i, min_len=128 if args.mixed else None) for i in range(n)]
    v = parse_variant(args.variant)
    config = GRPOConfig(
        out="/tmp/prof", dtype=v["dtype"], device=device, micro_batch_tokens=v["micro"],
        gradient_checkpointing=v["ckpt"], compile=v["compile"], pack=v["pack"], lr=1e-6, max_len=1025,
        cuda_graphs=False if "g" in v["knobs"] else None,
    )  # fmt: skip
    trainer = GRPOTrainer(config, model=fresh_model(cfg, device))
    annotate(trainer)
    started = time.perf_counter()
    for b in batches[: args.warmup]:
        trainer.step(b)
    torch.cuda.synchronize() if device == "cuda" else None
    print(f"warm-up {args.warmup} steps: {time.perf_counter() - started:.1f} s")
    for b in batches[args.warmup : args.warmup + args.timed]:
        started = time.perf_counter()
        metrics = trainer.step(b)
        torch.cuda.synchronize() if device == "cuda" else None
        wall = time.perf_counter() - started
        print(f"step {wall * 1e3:.1f} ms, {real_tokens(b) / wall:,.0f} real tok/s, {metrics['real_tokens']} tokens")
    from atropos_cli.trainer.step.batching import prepare

    b = batches[0]
    started = time.perf_counter()
    prepared = prepare(b, True, False, 1025)
    mid = time.perf_counter()
    mbs = list(trainer._micro_batches(prepared.samples))  # static rows collate as they are read
    done = time.perf_counter()
    print(
        f"host prep alone: prepare {1e3 * (mid - started):.1f} ms, collate {1e3 * (done - mid):.1f} ms, {len(mbs)} mb"
    )
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):  # thrown away: the first steps
        for b in batches[:2]:  # under a profiler recompile the compiled LM-head kernels once
            trainer.step(b)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for b in batches[args.warmup + args.timed :]:
            trainer.step(b)
        torch.cuda.synchronize() if device == "cuda" else None
    prof.export_chrome_trace(str(out / "trace.json"))
    with open(out / "trace.json") as f:
        trace = json.load(f)
    report = [analyse(trace, args.profiled)]
    averages = prof.key_averages()
    report.append(averages.table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=70))
    report.append(averages.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=70))
    text = "\n\n".join(report)
    (out / "profile.md").write_text(text)
    print(text)
    with open(out / "trace.json", "rb") as src, gzip.open(out / "trace.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    (out / "trace.json").unlink()


if __name__ == "__main__":
    main()
