"""`--inference-gpus auto`'s rule: how many of a run's N GPUs should generate, from measured times.

What is measured, per step, in GPU-seconds (what one step needs whatever the layout):
- generation G: the engines' sampling seconds (`generate_s`): in the disaggregated loop summed over its
  engines; in the colocated loop rank 0's, for its share, times the N ranks that each sample a share (where a
  row has no `generate_s`: the rest of its loop, `loop_s - step_time_s - sync_s`, times N);
- training T: `step_time_s` times the ranks that train.
`measured(metrics, world, engines)` reads them from a run's metrics.jsonl rows of that layout (the steps after
`warmup`; a split run's rows carry `staleness_mean`, a colocated run's do not).

The rule balances the two sides of the overlapped loop (`--max-staleness` >= 1): with K engines and N - K
trainers a step takes max(G / K, T / (N - K)) when a GPU's rates do not depend on how many share the work, so
`choose` picks the K in 1..N-1 with the smallest such step (ties: fewer engines, more memory per trainer).
It does not decide between a split and the colocated loop: under that linear model no split beats colocated
((G + T) / N is never above max(G / K, T / (N - K))); what a split gains in practice (the longest rollouts'
tail overlapped with training, bigger batches per engine, no weight copy into a colocated engine) is what
`benchmarks/bench_async.py` measures. `Split.describe()` is the line the run prints.

`auto_split(out, world)`: `atropos train --inference-gpus auto --resume` resolves the number here, before
torchrun starts, from OUT/metrics.jsonl (the steps trained so far, in the layout OUT/train_config.json records).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atropos_cli.errors import ConfigError

__all__ = ["Measured", "Split", "measured", "choose", "auto_split"]


@dataclass(frozen=True)
class Measured:
    generate_gpu_s: float  # GPU-seconds of generation a step needs
    train_gpu_s: float  # GPU-seconds of training a step needs
    steps: int  # the steps they are the mean of


@dataclass(frozen=True)
class Split:
    world: int
    engines: int  # of `world` GPUs, those that generate
    step_s: float  # the predicted seconds a step (the slower side)
    times: Measured

    def describe(self) -> str:
        m, n, k = self.times, self.world, self.engines
        return (
            f"--inference-gpus auto: {k} of {n} GPUs generate, {n - k} train (measured over {m.steps} steps: "
            f"generation {m.generate_gpu_s:.3g} GPU-s a step, training {m.train_gpu_s:.3g} GPU-s; predicted "
            f"{m.generate_gpu_s / k:.3g} s generating against {m.train_gpu_s / (n - k):.3g} s training a step)"
        )


def measured(metrics: list[dict[str, Any]], world: int, engines: int, warmup: int = 1) -> Measured | None:
    """Mean GPU-seconds a step of generation and of training, from metrics.jsonl rows of a run on `world` ranks
    of which `engines` generated (0: colocated); None when no trained step after `warmup` has the times."""
    split = engines > 0
    rows = [r for r in metrics if not r.get("skipped") and "step_time_s" in r and "loop_s" in r]
    rows = [r for r in rows if ("staleness_mean" in r) == split][warmup:]
    if not rows:
        return None
    generate = 0.0
    for r in rows:
        if "generate_s" in r:
            generate += float(r["generate_s"]) * (1 if split else world)
        else:
            rest = float(r["loop_s"]) - float(r["step_time_s"]) - float(r.get("sync_s", 0.0))
            generate += max(0.0, rest) * (1 if split else world)
    train = sum(float(r["step_time_s"]) for r in rows) * (world - engines)
    return Measured(generate / len(rows), train / len(rows), len(rows))


def choose(world: int, times: Measured) -> Split:
    """The K in 1..world-1 whose slower side is fastest (see the module docstring)."""
    if world < 2:
        raise ValueError("a split needs at least 2 GPUs")
    g, t = times.generate_gpu_s, times.train_gpu_s
    steps = {k: max(g / k, t / (world - k)) for k in range(1, world)}
    best = min(steps, key=lambda k: (steps[k], k))
    return Split(world, best, steps[best], times)


def auto_split(out: Path, world: int) -> Split:
    """The split of `world` GPUs from the steps OUT already trained (a ConfigError when there are none)."""
    if world < 2:
        raise ConfigError("--inference-gpus auto needs --nproc-per-node 2 or more", hint="e.g. --nproc-per-node 2")
    metrics, saved = out / "metrics.jsonl", out / "train_config.json"
    hint = (
        f"train a few steps first (e.g. --steps 3 --nproc-per-node {world} --out {out}), then rerun with "
        "--resume --inference-gpus auto"
    )
    if not metrics.is_file() or not saved.is_file():
        raise ConfigError(f"--inference-gpus auto needs measured steps in {metrics}: there are none", hint=hint)
    try:
        run = json.loads(saved.read_text()).get("run", {})
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    except (json.JSONDecodeError, OSError) as exc:
        raise ConfigError(f"cannot read the measured steps in {out} ({exc})", hint=hint) from None
    engines = run.get("inference_gpus") if isinstance(run.get("inference_gpus"), int) else 0
    times = measured(rows, int(run.get("nproc_per_node") or 1), engines)
    if times is None:
        raise ConfigError(f"--inference-gpus auto needs 2 or more trained steps in {metrics}", hint=hint)
    return choose(world, times)
