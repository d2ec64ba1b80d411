"""`--inference-gpus auto`'s rule: how many of a run's N GPUs should generate, from measured times.

What is measured, per step, in GPU-seconds (what one step needs whatever the layout):
- generation G: the colocated loop's sampling wall time (`loop_s - step_time_s`) times the N ranks that sample,
  or the disaggregated loop's `generate_s` (the engines' sampling seconds, summed over engines);
- training T: `step_time_s` times the ranks that train.
`measured(metrics, world, engines)` reads them from a run's metrics.jsonl rows (the steps after `warmup`).

The rule balances the two sides of the overlapped loop (`--max-staleness` >= 1): with K engines and N - K
trainers a step takes max(G / K, T / (N - K)) when a GPU's rates do not depend on how many share the work, so
`choose` picks the K in 1..N-1 with the smallest such step (ties: fewer engines, more memory per trainer).
It does not decide between a split and the colocated loop: under that linear model no split beats colocated
((G + T) / N is never above max(G / K, T / (N - K))); what a split gains in practice (the longest rollouts'
tail overlapped with training, bigger batches per engine, no weight copy into a colocated engine) is what
`benchmarks/bench_async.py` measures. `Split.describe()` is the line the run prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Measured", "Split", "measured", "choose"]


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
    rows = [r for r in metrics if not r.get("skipped") and "step_time_s" in r and "loop_s" in r][warmup:]
    if engines:
        rows = [r for r in rows if "generate_s" in r]
    if not rows:
        return None
    if engines:
        generate = sum(float(r["generate_s"]) for r in rows)
    else:  # every rank sampled its share, then trained: the rest of the loop is sampling (and the weight copy)
        generate = sum(max(0.0, float(r["loop_s"]) - float(r["step_time_s"])) * world for r in rows)
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
