"""`--plot`: OUT/reward_curve.png from OUT/metrics.jsonl (mean reward per step, its moving average, and the
fraction of groups with signal). matplotlib is imported only here and only when asked for.
"""

from __future__ import annotations

from pathlib import Path

from atropos_cli.errors import ConfigError

from .step.metrics import read_metrics

__all__ = ["plot_reward_curve", "PLOT_FILE"]

PLOT_FILE = "reward_curve.png"


def _moving_average(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot_reward_curve(out: Path, title: str | None = None) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: never needs a display
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError(
            "--plot needs matplotlib, which is not installed",
            hint='pip install "atropos[plot]" (matplotlib); metrics.jsonl has the numbers either way',
        ) from None
    rows = [r for r in read_metrics(out) if "reward_mean" in r]
    if not rows:
        raise ConfigError(
            f"no steps with rewards in {str(out / 'metrics.jsonl')!r} to plot",
            hint="plot a run that trained at least one step",
        )
    steps = [r["step"] for r in rows]
    rewards = [r["reward_mean"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot(steps, rewards, color="#9bb7d4", linewidth=1, label="mean reward per step")
    ax.plot(steps, _moving_average(rewards, 10), color="#1f4e79", linewidth=2, label="moving average (10)")
    if all("signal_fraction" in r for r in rows):
        signal = [r["signal_fraction"] for r in rows]
        ax.plot(steps, signal, color="#c0504d", linewidth=1, alpha=0.6, label="groups with signal")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("reward")
    ax.set_ylim(-0.02, 1.02 if max(rewards) <= 1.0 else None)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title or f"atropos train: {out.name}")
    fig.tight_layout()
    path = out / PLOT_FILE
    fig.savefig(path)
    plt.close(fig)
    return path
