"""CUDA graphs of whole micro-batches (trainer/step/graphs.py) against the eager step, on a GPU.

The same Qwen2.5-0.5B-shaped model (random weights), the same mixed-length batches (bench_trainer.py's), three
runs from the same start: eager, eager again (the run-to-run noise floor: flash attention's backward adds with
atomics), and with CUDA graphs. Per step: loss, gradient norm and the loss stats; after the last step: how far
each run's weight update is from the first eager run's, relative to that update. Exits 1 if a recording failed
or the graphed update is off by more than 3x the noise floor (+1e-3).

Under torchrun every rank is a replica (`--parallel replicate`, each its share of a batch of SEQS x ranks): the
graphed run's gradient sums start behind the marks its recordings put in the graph (`replicate.OverlappedSum`);
a sum started too early would add partial gradients, far off the noise floor. Rank 0 prints.

    python benchmarks/check_graphs.py --steps 6
    python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/check_graphs.py --steps 6
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_trainer import fresh_model, make_groups, qwen_config  # noqa: E402


def run(graphs: bool, cfg, state, batches, args, dist=None) -> dict:
    from atropos_cli.trainer.step.grpo import GRPOConfig, GRPOTrainer

    torch._dynamo.reset()
    device = dist.device if dist is not None else args.device
    model = fresh_model(cfg, device, state=state)
    config = GRPOConfig(
        out="/tmp/check", device=device, cuda_graphs=graphs, lr=1e-5, max_len=args.seq_len + 1, parallel="replicate"
    )
    trainer = GRPOTrainer(config, model=model, dist=dist)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = [trainer.step(b) for b in batches]
    master = trainer.precision.master or trainer.precision.params
    out = {
        "metrics": metrics,
        "weights": torch.cat([m.detach().float().flatten() for m in master]).cpu(),
        "warnings": [str(w.message) for w in caught if "CUDA graphs" in str(w.message)],
        "graphs": None,
    }
    if trainer.graphs is not None:
        g = trainer.graphs
        out["graphs"] = {"recorded": g.recorded, "replayed": g.replayed, "eager": g.eager, "failed": g.failed}
        out["graphs"]["errors"] = sorted(set(g.errors))
        reducer = trainer.precision.reducer
        if reducer is not None:  # the last step's buckets started behind the last replay's marks / all
            out["graphs"]["buckets marked/all"] = f"{reducer.early}/{len(reducer.flats)}"
    del trainer, model
    torch.cuda.empty_cache()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seqs", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--min-len", type=int, default=128)
    args = parser.parse_args()
    if not args.device.startswith("cuda") or not torch.cuda.is_available():
        print("check_graphs.py: CUDA graphs need a CUDA device (none here)", file=sys.stderr)
        return 2
    from atropos_cli.trainer.scale.distributed import in_launcher, init_from_env

    dist = init_from_env(args.device, 600) if in_launcher() else None
    world = dist.world if dist is not None else 1
    cfg = qwen_config(False)
    state = {k: v.cpu() for k, v in fresh_model(cfg, "cpu").state_dict().items()}
    start = torch.cat([p.detach().float().flatten() for p in fresh_model(cfg, "cpu", state=state).parameters()])
    batches = [
        make_groups(args.seqs * world, args.seq_len, 8, cfg.vocab_size, seed=s, min_len=args.min_len)
        for s in range(args.steps)
    ]
    runs = {
        name: run(graphs, cfg, state, batches, args, dist)
        for name, graphs in (("eager", False), ("eager 2", False), ("graphs", True))
    }
    if dist is not None:
        replicas = dist.gather(runs["graphs"]["graphs"])
        dist.close()
        if dist.rank != 0:
            return 0
        runs["graphs"]["graphs"] = {"rank 0": runs["graphs"]["graphs"], "every rank": replicas}
    base = runs["eager"]
    how = f"{world} replicas, each {args.seqs}" if dist is not None else f"{args.seqs}"
    print(f"# CUDA graphs vs eager steps: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{args.steps} steps of {how} mixed-length sequences ({args.min_len}-{args.seq_len} tokens), 0.5B shape\n")
    print("| step | run | loss | grad norm | clip fraction | logprob gap | real tokens |")
    print("|---|---|---|---|---|---|---|")
    for i in range(args.steps):
        for name, r in runs.items():
            m = r["metrics"][i]
            print(
                f"| {i + 1} | {name} | {m['loss']:.6g} | {m['grad_norm']:.6g} | {m.get('clip_fraction', 0):.4g} "
                f"| {m.get('logprob_gap', 0):.6g} | {m['real_tokens']:.0f} |"
            )
    scale = float((base["weights"] - start).norm())  # the eager run's update
    diffs = {
        name: float((r["weights"] - base["weights"]).norm()) / scale for name, r in runs.items() if name != "eager"
    }
    print()
    for name, d in diffs.items():
        print(f"weights after step {args.steps}, {name} vs eager: {d:.3e} of the update")
    print(f"graphs: {runs['graphs']['graphs']}; warnings: {runs['graphs']['warnings'] or 'none'}")
    g = runs["graphs"]["graphs"]
    every = g["every rank"] if g is not None and "every rank" in g else [g]
    replayed = all(r is not None and not r["failed"] and r["replayed"] > 0 for r in every)
    ok = replayed and diffs["graphs"] <= 3 * diffs["eager 2"] + 1e-3
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
